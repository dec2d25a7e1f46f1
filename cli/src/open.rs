//! Opening the store a URL names, as an [`Admin`] handle: the one place that knows the
//! backends. The URL grammar is the examples' [`StoreUrl`] (until the `dedup` crate's own
//! opener replaces this function); each scheme is opened here with its concrete store
//! type, since reaching [`Admin`] needs more than a `dyn DedupStore`.
//!
//! Nothing but `dedup migrate` creates a schema: PostgreSQL is opened without migrating,
//! Redis has none, and an SQLite path must already exist (opening an SQLite file creates
//! the table in it, so a mistyped path would otherwise leave an empty database behind).

use std::path::Path;
use std::sync::Arc;

use dedup_core::Admin;
use dedup_examples::StoreUrl;
use dedup_postgres::{PostgresConfig, PostgresStore};
use dedup_redis::{RedisConfig, RedisStore};
use dedup_sqlite::{SqliteConfig, SqliteStore};

use crate::StoreArgs;
use crate::failure::Failure;

/// An opened store and a line describing it for people.
pub(crate) struct Opened {
    /// The store.
    pub(crate) store: Arc<dyn Admin>,
    /// The backend's name (`sqlite`, `postgres`, `redis`, `redis-cluster`, `memory`).
    pub(crate) backend: &'static str,
    /// Where the records are: a table, a key prefix.
    pub(crate) location: String,
}

/// Open the store `args` name; with `migrate`, create or upgrade its schema first.
pub(crate) async fn open(args: &StoreArgs, migrate: bool) -> Result<Opened, Failure> {
    let Some(url) = &args.url else {
        return Err(Failure::usage("no store given").hint(
            "pass --store URL or set DEDUP_STORE_URL (sqlite:PATH, postgres://..., redis://...)",
        ));
    };
    let parsed =
        StoreUrl::parse(url).map_err(|e| Failure::store("cannot read the store URL", e))?;
    let backend = parsed.backend();
    let failed = |e| Failure::store(format!("cannot open the {backend} store"), e);
    let (store, location): (Arc<dyn Admin>, String) = match parsed {
        StoreUrl::Memory => (
            Arc::new(dedup_core::MemoryStore::new()),
            "this process's memory (empty)".into(),
        ),
        StoreUrl::Sqlite(path) => {
            let mut config = SqliteConfig::default();
            if let Some(table) = &args.table {
                config.table = table.clone();
            }
            let table = config.table.clone();
            let store = match &path {
                Some(path) => {
                    if !migrate && !Path::new(path).exists() {
                        return Err(Failure::not_found(format!("no SQLite database at {path}"))
                            .hint("check the path, or create the store with `dedup migrate`"));
                    }
                    SqliteStore::open_with(path, config).await
                }
                None => SqliteStore::open_in_memory_with(config).await,
            }
            .map_err(failed)?;
            let file = path.unwrap_or_else(|| ":memory:".into());
            (Arc::new(store), format!("{file}, table {table}"))
        }
        StoreUrl::Postgres(url) => {
            let mut config = PostgresConfig::default();
            if let Some(table) = &args.table {
                config.table = table.clone();
            }
            if let Some(schema) = &args.schema {
                config.schema = schema.clone();
            }
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(2)
                .acquire_timeout(std::time::Duration::from_secs(args.connect_timeout))
                .connect(&url)
                .await
                .map_err(|e| {
                    Failure::new("cannot connect to PostgreSQL").cause(e).hint(
                        "check the URL (--store or DEDUP_STORE_URL) and that the server is up",
                    )
                })?;
            let store = PostgresStore::from_pool(pool, config)
                .await
                .map_err(failed)?;
            if migrate {
                store.migrate().await.map_err(failed)?;
            }
            let table = store.table().to_owned();
            (Arc::new(store), format!("table {table}"))
        }
        StoreUrl::Redis(url) => open_redis(args, &[url], false).await.map_err(failed)?,
        StoreUrl::RedisCluster(urls) => open_redis(args, &urls, true).await.map_err(failed)?,
    };
    Ok(Opened {
        store,
        backend,
        location,
    })
}

/// A Redis store on one server (`urls[0]`) or a cluster (seed nodes `urls`), and where its
/// records are.
async fn open_redis(
    args: &StoreArgs,
    urls: &[String],
    cluster: bool,
) -> dedup_core::Result<(Arc<dyn Admin>, String)> {
    let mut config = RedisConfig::default();
    if let Some(prefix) = &args.prefix {
        config.prefix = prefix.clone();
    }
    let location = format!("key prefix {}", config.prefix);
    let store = match cluster {
        true => RedisStore::connect_cluster(urls, config).await?,
        false => RedisStore::connect_with(&urls[0], config).await?,
    };
    Ok((Arc::new(store), location))
}
