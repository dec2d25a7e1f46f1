//! Opening the store a URL names, as an [`Admin`] handle: the one place that knows the
//! backends. The URL and its parameters are the `dedup` crate's ([`StoreUrl`]); each
//! backend is then opened here with its concrete store type, since reaching [`Admin`]
//! needs more than the `dyn DedupStore` that `dedup::open` returns. `--table`,
//! `--schema` and `--prefix` override the URL's parameters.
//!
//! An SQLite path must already exist unless the command is `dedup migrate` (opening an
//! SQLite file creates the table in it, so a mistyped path would otherwise leave an empty
//! database behind). PostgreSQL stores create or upgrade their table when opened, as every
//! `PostgresStore` does; Redis has no schema.

use std::sync::Arc;

use dedup::{Admin, PostgresStore, RedisConfig, RedisStore, SqliteStore, StoreTarget, StoreUrl};

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
    let parsed = StoreUrl::parse(url).map_err(|e| {
        let code = if e.url_problem().is_some() {
            Failure::usage
        } else {
            Failure::new
        };
        code("cannot use the store URL")
            .cause(e)
            .hint("see `dedup --help` and the dedup crate's README for the URL forms")
    })?;
    let backend = parsed.backend();
    let failed = |e| Failure::store(format!("cannot open the {backend} store"), e);
    let (store, location): (Arc<dyn Admin>, String) = match parsed.into_target() {
        StoreTarget::Memory { .. } => (
            Arc::new(dedup::MemoryStore::new()),
            "this process's memory (empty)".into(),
        ),
        StoreTarget::Sqlite { path, mut config } => {
            if let Some(table) = &args.table {
                config.table = table.clone();
            }
            let table = config.table.clone();
            let store = match &path {
                Some(path) => {
                    if !migrate && !path.exists() {
                        return Err(Failure::not_found(format!(
                            "no SQLite database at {}",
                            path.display()
                        ))
                        .hint("check the path, or create the store with `dedup migrate`"));
                    }
                    SqliteStore::open_with(path, config).await
                }
                None => SqliteStore::open_in_memory_with(config).await,
            }
            .map_err(failed)?;
            let file = path.map_or(":memory:".into(), |p| p.display().to_string());
            (Arc::new(store), format!("{file}, table {table}"))
        }
        StoreTarget::Postgres { url, mut config } => {
            if let Some(table) = &args.table {
                config.table = table.clone();
            }
            if let Some(schema) = &args.schema {
                config.schema = schema.clone();
            }
            let store = PostgresStore::connect_with(&url, config)
                .await
                .map_err(failed)?;
            let table = store.table().to_owned();
            (Arc::new(store), format!("table {table}"))
        }
        StoreTarget::Redis { url, config } => open_redis(args, &[url], config, false)
            .await
            .map_err(failed)?,
        StoreTarget::RedisCluster { urls, config } => open_redis(args, &urls, config, true)
            .await
            .map_err(failed)?,
        _ => {
            return Err(Failure::usage(format!(
                "this build cannot open {backend} stores"
            )));
        }
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
    mut config: RedisConfig,
    cluster: bool,
) -> dedup::Result<(Arc<dyn Admin>, String)> {
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
