//! [`SqlStore`]: a sqlx store as the shared connect, migrate and check steps see it. What a
//! store's `connect_with` and `migrate` do is written here once; a backend supplies how it
//! opens its pool, builds its store over a pool and migrates its tables.

use async_trait::async_trait;
use dedup_core::{Key, Record, Result};
use sqlx::{Pool, SqlSafeStr};

use crate::config::TargetConfig;
use crate::error::{RowOf, SqlBackend};
use crate::migrate::{self, Migrations};
use crate::query::{Param, SqlDb};

/// The pool of a [`SqlStore`]'s database.
pub type StorePool<S> = Pool<<<S as SqlStore>::Backend as SqlBackend>::Db>;

/// A sqlx store (`PostgresStore`, `MySqlStore`) as the shared steps see it: its backend,
/// its configuration, its pool, its records table's migrations (whose `after` hook
/// migrates the outbox's tables).
#[async_trait]
pub trait SqlStore: Send + Sync + Sized + 'static {
    /// The backend: its database, its name in errors, its retryable errors.
    type Backend: SqlBackend;

    /// The store's configuration.
    type Config: TargetConfig;

    /// The records table's migrations on this store's pool and configuration.
    type Migrations<'a>: Migrations<Db = <Self::Backend as SqlBackend>::Db> + Send
    where
        Self: 'a;

    /// A pool for `url` with `config`'s settings, its first connection made (the
    /// backend's options and the hints for the usual mistakes).
    async fn open_pool(url: &str, config: &Self::Config) -> Result<StorePool<Self>>;

    /// A store over `pool` (the backend's `from_pool`: checks `config`, touches nothing).
    async fn over_pool(pool: StorePool<Self>, config: Self::Config) -> Result<Self>;

    /// The store's pool.
    fn store_pool(&self) -> &StorePool<Self>;

    /// The store's configuration.
    fn store_config(&self) -> &Self::Config;

    /// The records table's migrations.
    fn migrations(&self) -> Self::Migrations<'_>;

    /// Record, for the store and its clones, that its tables were just migrated: what it
    /// would check before first use (its outbox table) is known current.
    fn tables_migrated(&self);
}

/// Connect to `url` with `config`: the configuration checked before anything connects,
/// the pool opened (its first connection made within the connect timeout), then the
/// tables migrated, or only checked (writing nothing) when the configuration says not to
/// migrate.
pub async fn connect_with<S: SqlStore>(url: &str, config: S::Config) -> Result<S> {
    config.check()?;
    let pool = S::open_pool(url, &config).await?;
    let store = S::over_pool(pool, config).await?;
    let run = store.store_config().migrate;
    migrate::migrate_or_check(run, migrate(&store), check(&store)).await?;
    Ok(store)
}

/// How many times a migration runs again after a conflict, before its error comes back.
const MIGRATE_TRIES: u32 = 5;

/// Create or upgrade the store's tables (the records table, then the outbox's, under the
/// backend's lock), then mark them current for the store and its clones.
///
/// A migration the database refused over a conflict runs again: a migration is
/// idempotent. On a Galera cluster the lock is one node's own, and migrations through two
/// nodes at once can fail certification.
pub async fn migrate<S: SqlStore>(store: &S) -> Result<()> {
    store.store_config().check()?;
    let mut tries = 1;
    while let Err(e) = migrate::migrate(&store.migrations()).await {
        if tries == MIGRATE_TRIES || !conflict::<S::Backend>(&e) {
            return Err(e);
        }
        tries += 1;
    }
    store.tables_migrated();
    Ok(())
}

/// Whether `error`'s source is a driver error backend `B` calls a conflict.
fn conflict<B: SqlBackend>(error: &dedup_core::Error) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<sqlx::Error>())
        .is_some_and(B::is_conflict)
}

/// Check, writing nothing, that the records table is at this build's version: for stores
/// opened without migrating (see [`migrate::check`]).
pub async fn check<S: SqlStore>(store: &S) -> Result<()> {
    let mut conn = store
        .store_pool()
        .acquire()
        .await
        .map_err(<S::Backend as SqlBackend>::error)?;
    migrate::check(&store.migrations(), &mut conn).await
}

/// The record of `key` (`None`: it has none), read by `statement`, whose parameters are
/// the key's consumer and message id, and decoded by `decode`.
pub async fn record<B: SqlBackend>(
    pool: &Pool<B::Db>,
    statement: impl SqlSafeStr,
    key: &Key,
    decode: fn(&RowOf<B>, &Key) -> Result<Record>,
) -> Result<Option<Record>> {
    let params = [
        Param::Text(Some(key.consumer())),
        Param::Text(Some(key.message_id())),
    ];
    B::Db::fetch_optional(pool, statement, &params)
        .await
        .map_err(B::error)?
        .map(|row| decode(&row, key))
        .transpose()
}
