//! [`open`]: a ready store from a URL; [`open_admin`]: the operator's view of the same store.

use std::sync::Arc;

use dedup_core::outbox::{MemoryOutbox, OutboxStore};
use dedup_core::{Admin, Clock, DedupStore, MemoryStore};

use crate::error::{OpenError, UrlError};
use crate::url::{StoreTarget, StoreUrl};

/// Open the store `url` names, ready to use: connected, schema created or migrated, on
/// the backend's default clock (the server's for PostgreSQL, MySQL and Redis unless the URL says
/// `clock=local`). See the crate docs for the URL forms and parameters.
///
/// The URL is checked completely before anything is contacted or written: an unknown
/// scheme or parameter, a bad value or a backend this build lacks is an
/// [`OpenError::Url`]. Server backends connect within their connect timeout (default
/// 5 s, `connect_timeout=` in the URL) and fail with the cause.
pub async fn open(url: &str) -> Result<Arc<dyn DedupStore>, OpenError> {
    StoreUrl::parse(url)?.open().await
}

/// [`open`], as the operator's view of the store: an [`Admin`] handle (which is also a
/// [`DedupStore`]) for listing, counting, purging and releasing by hand. Every backend
/// implements [`Admin`], so this is the same store `open` returns, with more methods.
pub async fn open_admin(url: &str) -> Result<Arc<dyn Admin>, OpenError> {
    StoreUrl::parse(url)?.open_admin().await
}

/// The transactional outbox of the store `url` names, for relays and operators (`dedup
/// outbox`): the outbox table of a `sqlite:` or `postgres://` store (opened, and migrated
/// unless the URL says `migrate=false`, as [`open`] does), or a fresh
/// [`MemoryOutbox`] for `memory:`. Redis and MySQL stores have no outbox: that is an
/// [`OpenError::Url`] with [`UrlError::NoOutbox`], before anything is contacted.
pub async fn open_outbox(url: &str) -> Result<Arc<dyn OutboxStore>, OpenError> {
    StoreUrl::parse(url)?.open_outbox().await
}

/// [`open`] with an injected clock for lease arithmetic (simulations, tests).
pub async fn open_with_clock(
    url: &str,
    clock: Arc<dyn Clock>,
) -> Result<Arc<dyn DedupStore>, OpenError> {
    StoreUrl::parse(url)?.with_clock(clock).open().await
}

impl StoreUrl {
    /// Open the store (see [`open`]).
    pub async fn open(self) -> Result<Arc<dyn DedupStore>, OpenError> {
        Ok(self.open_admin().await?)
    }

    /// Open the store as an [`Admin`] handle (see [`open_admin`]).
    pub async fn open_admin(self) -> Result<Arc<dyn Admin>, OpenError> {
        let url = self.to_string();
        open_target(self.into_target())
            .await
            .map_err(|source| OpenError::Store { url, source })
    }
}

impl StoreUrl {
    /// Open the store's outbox (see [`open_outbox`]).
    pub async fn open_outbox(self) -> Result<Arc<dyn OutboxStore>, OpenError> {
        let url = self.to_string();
        let backend = self.backend();
        let target = self.into_target();
        let outbox: Arc<dyn OutboxStore> = match target {
            StoreTarget::Memory { clock } => Arc::new(match clock {
                Some(c) => MemoryOutbox::with_clock(c),
                None => MemoryOutbox::new(),
            }),
            #[cfg(feature = "sqlite")]
            StoreTarget::Sqlite { path, config } => {
                use dedup_sqlite::SqliteStore;
                let store = match path {
                    Some(path) => SqliteStore::open_with(path, config).await,
                    None => SqliteStore::open_in_memory_with(config).await,
                };
                let store = store.map_err(|source| OpenError::Store {
                    url: url.clone(),
                    source,
                })?;
                Arc::new(store.outbox())
            }
            #[cfg(feature = "postgres")]
            StoreTarget::Postgres {
                url: server,
                config,
            } => {
                let store = dedup_postgres::PostgresStore::connect_with(&server, config)
                    .await
                    .map_err(|source| OpenError::Store {
                        url: url.clone(),
                        source,
                    })?;
                Arc::new(store.outbox())
            }
            #[allow(unreachable_patterns)] // with only the SQL backends built
            _ => {
                return Err(OpenError::Url {
                    url,
                    problem: UrlError::NoOutbox { backend },
                });
            }
        };
        Ok(outbox)
    }
}

async fn open_target(target: StoreTarget) -> dedup_core::Result<Arc<dyn Admin>> {
    Ok(match target {
        StoreTarget::Memory { clock } => Arc::new(match clock {
            Some(c) => MemoryStore::with_clock(c),
            None => MemoryStore::new(),
        }),
        #[cfg(feature = "sqlite")]
        StoreTarget::Sqlite { path, config } => {
            use dedup_sqlite::SqliteStore;
            Arc::new(match path {
                Some(path) => SqliteStore::open_with(path, config).await?,
                None => SqliteStore::open_in_memory_with(config).await?,
            })
        }
        #[cfg(feature = "postgres")]
        StoreTarget::Postgres { url, config } => {
            Arc::new(dedup_postgres::PostgresStore::connect_with(&url, config).await?)
        }
        #[cfg(feature = "mysql")]
        StoreTarget::MySql { url, config } => {
            Arc::new(dedup_mysql::MySqlStore::connect_with(&url, config).await?)
        }
        #[cfg(feature = "redis")]
        StoreTarget::Redis { url, config } => {
            Arc::new(dedup_redis::RedisStore::connect_with(&url, config).await?)
        }
        #[cfg(feature = "redis")]
        StoreTarget::RedisCluster { urls, config } => {
            Arc::new(dedup_redis::RedisStore::connect_cluster(&urls, config).await?)
        }
    })
}
