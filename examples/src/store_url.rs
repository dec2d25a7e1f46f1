//! Choosing the backend by configuration: one entry point that opens a store from a URL.
//!
//! | URL | store | cargo feature |
//! |---|---|---|
//! | `memory:` | [`MemoryStore`] (in-process, forgets on exit) | always |
//! | `sqlite:PATH`, `sqlite://PATH`, `sqlite::memory:` | `SqliteStore` | `sqlite` |
//! | `postgres://...`, `postgresql://...` | `PostgresStore` (migrates on connect) | `postgres` |
//! | `redis://...`, `rediss://...` | `RedisStore`, standalone | `redis` |
//! | `redis+cluster://h1:p1,h2:p2,...` | `RedisStore` on a Redis Cluster | `redis` |
//!
//! Each backend is an optional dependency behind its feature (all on by default), so a
//! service compiles only the backends it uses.

use std::path::Path;
use std::sync::Arc;

use dedup_core::{Clock, DedupStore, Error, MemoryStore, Result};

/// A parsed store URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// `memory:`
    Memory,
    /// `sqlite:PATH` (`None` path: in memory).
    Sqlite(Option<String>),
    /// `postgres://...`
    Postgres(String),
    /// `redis://...`
    Redis(String),
    /// `redis+cluster://h1:p1,h2:p2`: one `redis://` URL per seed node.
    RedisCluster(Vec<String>),
}

impl StoreUrl {
    /// Parse `url` (see the module docs for the forms).
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |why: &str| Error::invalid("store url", format!("{url:?}: {why}"));
        if url == "memory:" || url == "memory://" {
            return Ok(StoreUrl::Memory);
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(StoreUrl::Postgres(url.to_string()));
        }
        if let Some(nodes) = url.strip_prefix("redis+cluster://") {
            let urls: Vec<String> = nodes
                .split(',')
                .filter(|n| !n.is_empty())
                .map(|n| format!("redis://{n}"))
                .collect();
            if urls.is_empty() {
                return Err(bad("no cluster nodes"));
            }
            return Ok(StoreUrl::RedisCluster(urls));
        }
        if url.starts_with("redis://") || url.starts_with("rediss://") {
            return Ok(StoreUrl::Redis(url.to_string()));
        }
        if let Some(rest) = url.strip_prefix("sqlite:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            return match path {
                "" => Err(bad(
                    "missing path (use sqlite::memory: for an in-memory database)",
                )),
                ":memory:" => Ok(StoreUrl::Sqlite(None)),
                p => Ok(StoreUrl::Sqlite(Some(p.to_string()))),
            };
        }
        Err(bad(
            "unknown scheme (memory:, sqlite:PATH, postgres://, redis://, redis+cluster://)",
        ))
    }

    /// The backend's name, for reports.
    pub fn backend(&self) -> &'static str {
        match self {
            StoreUrl::Memory => "memory",
            StoreUrl::Sqlite(_) => "sqlite",
            StoreUrl::Postgres(_) => "postgres",
            StoreUrl::Redis(_) => "redis",
            StoreUrl::RedisCluster(_) => "redis-cluster",
        }
    }
}

#[allow(dead_code)] // unused when every backend feature is off
fn disabled(feature: &'static str) -> Error {
    Error::invalid(
        "store url",
        format!("this build has no {feature} backend (enable the `{feature}` cargo feature)"),
    )
}

/// The store URL an example program uses: its `--store` argument when given, else an SQLite
/// file named `file` in `dir` (a temporary folder the program owns: the embedded default).
pub fn url_or_temp_sqlite(store: Option<String>, dir: &Path, file: &str) -> String {
    store.unwrap_or_else(|| format!("sqlite:{}", dir.join(file).display()))
}

/// Open the store `url` names, ready to use (SQL schemas migrated), on its default clock
/// (the server's for PostgreSQL and Redis, the system's otherwise).
pub async fn open_store(url: &str) -> Result<Arc<dyn DedupStore>> {
    open_store_with_clock(url, None).await
}

/// [`open_store`] with an injected clock for lease arithmetic (simulations, tests).
pub async fn open_store_with_clock(
    url: &str,
    clock: Option<Arc<dyn Clock>>,
) -> Result<Arc<dyn DedupStore>> {
    let store: Arc<dyn DedupStore> = match StoreUrl::parse(url)? {
        StoreUrl::Memory => Arc::new(match clock {
            Some(c) => MemoryStore::with_clock(c),
            None => MemoryStore::new(),
        }),
        #[cfg(feature = "sqlite")]
        StoreUrl::Sqlite(path) => {
            use dedup_sqlite::{SqliteConfig, SqliteStore};
            let config = SqliteConfig {
                clock,
                ..SqliteConfig::default()
            };
            Arc::new(match path {
                Some(path) => SqliteStore::open_with(path, config).await?,
                None => SqliteStore::open_in_memory_with(config).await?,
            })
        }
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(url) => {
            use dedup_postgres::{PostgresConfig, PostgresStore};
            let config = PostgresConfig {
                clock,
                ..PostgresConfig::default()
            };
            Arc::new(PostgresStore::connect_with(&url, config).await?)
        }
        #[cfg(feature = "redis")]
        StoreUrl::Redis(url) => {
            use dedup_redis::{RedisConfig, RedisStore};
            let config = RedisConfig {
                clock,
                ..RedisConfig::default()
            };
            Arc::new(RedisStore::connect_with(&url, config).await?)
        }
        #[cfg(feature = "redis")]
        StoreUrl::RedisCluster(urls) => {
            use dedup_redis::{RedisConfig, RedisStore};
            let config = RedisConfig {
                clock,
                ..RedisConfig::default()
            };
            Arc::new(RedisStore::connect_cluster(&urls, config).await?)
        }
        #[allow(unreachable_patterns)]
        other => return Err(disabled(other.backend())),
    };
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!(StoreUrl::parse("memory:").unwrap(), StoreUrl::Memory);
        assert_eq!(
            StoreUrl::parse("sqlite:/tmp/x.db").unwrap(),
            StoreUrl::Sqlite(Some("/tmp/x.db".into()))
        );
        assert_eq!(
            StoreUrl::parse("sqlite:///tmp/x.db").unwrap(),
            StoreUrl::Sqlite(Some("/tmp/x.db".into()))
        );
        assert_eq!(
            StoreUrl::parse("sqlite::memory:").unwrap(),
            StoreUrl::Sqlite(None)
        );
        assert_eq!(
            StoreUrl::parse("redis+cluster://a:1,b:2").unwrap(),
            StoreUrl::RedisCluster(vec!["redis://a:1".into(), "redis://b:2".into()])
        );
        assert!(matches!(
            StoreUrl::parse("postgresql://u@h/db").unwrap(),
            StoreUrl::Postgres(_)
        ));
        for bad in ["", "mysql://x", "sqlite:", "redis+cluster://"] {
            assert!(
                StoreUrl::parse(bad).unwrap_err().is_invalid_input(),
                "{bad}"
            );
        }
    }
}
