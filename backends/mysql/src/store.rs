//! [`MySqlStore`]: the [`DedupStore`](dedup_core::DedupStore) over a MySQL / MariaDB table:
//! the type, its constructors, accessors and keyed reads here; its
//! [`Storage`](dedup_core::backend::Storage) implementation in [`storage`], the fast paths
//! of the common cases in [`fast`], the store's own locked transactions in [`locked`].

use std::fmt;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use dedup_core::{Fingerprint, Key, Result, Timestamp};
use dedup_sql::SqlStore;
use sqlx::mysql::{MySqlQueryResult, MySqlRow};
use sqlx::{AssertSqlSafe, MySqlConnection, MySqlPool};

use crate::config::MySqlConfig;
use crate::decode::{Stored, decode_stored, key_of};
use crate::error::Backend;
use crate::outbox_table::OutboxTable;
use crate::schema::Inbox;
use crate::statements::Statements;

mod fast;
mod locked;
mod storage;

/// A [`DedupStore`](dedup_core::DedupStore) keeping its records in one MySQL / MariaDB
/// (InnoDB) table.
///
/// Cheap to clone (the clones share the pool). Each lease-mode operation is one short
/// transaction of the store's own: a locking read of the keys (`SELECT ... FOR UPDATE`,
/// READ COMMITTED), the contract applied to what it read
/// ([`transition`](dedup_core::backend::transition)), one write statement; a batch is the
/// same with one read and one write statement for all its keys. Lease time comes from the
/// server's clock unless the [`MySqlConfig`] injects one.
/// [`claim_in_tx`](Self::claim_in_tx) and [`commit_in_tx`](Self::commit_in_tx) join the
/// caller's own transaction.
#[derive(Clone)]
pub struct MySqlStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: MySqlPool,
    config: MySqlConfig,
    table: String,
    sql: Statements,
    /// Whether a purge batch is one `DELETE ... RETURNING`, once asked.
    purge_returning: OnceLock<bool>,
    /// The outbox's tables ([`MySqlStore::outbox`]).
    outbox: OutboxTable,
}

impl fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlStore")
            .field("table", &self.inner.table)
            .field("clock", &self.inner.config.clock)
            .field("pool", &self.inner.pool)
            .finish()
    }
}

impl MySqlStore {
    /// Connect to `url` with the default [`MySqlConfig`] and [`migrate`](Self::migrate).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, MySqlConfig::default()).await
    }

    /// Connect to `url` (`mysql://user:password@host:port/database`) with a pool of
    /// `config.max_connections` and [`migrate`](Self::migrate) (with `config.migrate`
    /// false: only check that the table is at this version's schema, writing nothing).
    ///
    /// The first connection is made at once, within `config.connect_timeout`: a wrong host,
    /// port, user, password, database or TLS setting fails here with the server's or the
    /// operating system's error as the source and a hint in the message.
    pub async fn connect_with(url: &str, config: MySqlConfig) -> Result<Self> {
        dedup_sql::store::connect_with(url, config).await
    }

    /// A store over an existing pool. Validates the table name; does not touch the
    /// database (call [`migrate`](Self::migrate) unless the schema is managed elsewhere).
    pub async fn from_pool(pool: MySqlPool, config: MySqlConfig) -> Result<Self> {
        config.validate()?;
        let table = config.quoted_table();
        Ok(MySqlStore {
            inner: Arc::new(Inner {
                pool,
                sql: Statements::new(&table),
                outbox: OutboxTable::new(&config),
                table,
                config,
                purge_returning: OnceLock::new(),
            }),
        })
    }

    /// Create the records and outbox tables and their indexes when missing, or upgrade
    /// them. Idempotent, and safe to run from many nodes at once (they take turns under a
    /// named lock).
    pub async fn migrate(&self) -> Result<()> {
        dedup_sql::store::migrate(self).await
    }

    /// The connection pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.inner.pool
    }

    /// The configuration this store was built with.
    pub fn config(&self) -> &MySqlConfig {
        &self.inner.config
    }

    /// The `` `table` `` this store uses, quoted.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    pub(crate) fn outbox_table(&self) -> &OutboxTable {
        &self.inner.outbox
    }

    pub(crate) fn statements(&self) -> &Statements {
        &self.inner.sql
    }

    /// Whether a purge batch is one `DELETE ... RETURNING`: on MariaDB (MySQL lacks it),
    /// but not on a Galera node. There a certification conflict can come after the
    /// returned rows, and sqlx-mysql was seen to panic decoding such an answer; a batch
    /// is then the locked transaction MySQL runs, whose conflict comes at `COMMIT`.
    /// Asked once (`SELECT VERSION()`, `SHOW VARIABLES LIKE 'wsrep_on'`), then remembered.
    pub(crate) async fn purges_with_returning(&self) -> std::result::Result<bool, sqlx::Error> {
        if let Some(&returning) = self.inner.purge_returning.get() {
            return Ok(returning);
        }
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&self.inner.pool)
            .await?;
        let wsrep: Option<(String, String)> = sqlx::query_as("SHOW VARIABLES LIKE 'wsrep_on'")
            .fetch_optional(&self.inner.pool)
            .await?;
        let galera = wsrep.is_some_and(|(_, on)| on.eq_ignore_ascii_case("on"));
        let returning = version.to_ascii_lowercase().contains("mariadb") && !galera;
        Ok(*self.inner.purge_returning.get_or_init(|| returning))
    }

    /// The injected clock's time, bound for "now" (NULL: the server's clock).
    pub(crate) fn now_param(&self) -> Option<i64> {
        self.inner.config.now_param()
    }

    /// Read `keys` (distinct, in key order) on `conn` with "now"; `locking` keeps the rows
    /// found locked until the transaction ends. One statement, and one more for "now"
    /// when none of the keys has a record.
    pub(crate) async fn read(
        &self,
        conn: &mut MySqlConnection,
        keys: &[&Key],
        locking: bool,
    ) -> std::result::Result<(Timestamp, Vec<(Key, Stored)>), ReadError> {
        let (now, found, _) = self.read_noting(conn, keys, locking).await?;
        Ok((now, found))
    }

    /// [`read`](Self::read), also giving the session's `LAST_INSERT_ID()` as the read saw
    /// it, when it found a record (see [`last_insert_id`]).
    pub(crate) async fn read_noting(
        &self,
        conn: &mut MySqlConnection,
        keys: &[&Key],
        locking: bool,
    ) -> std::result::Result<(Timestamp, Vec<(Key, Stored)>, Option<u64>), ReadError> {
        let sql = self.inner.sql.read(keys.len(), locking);
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(self.now_param());
        for key in keys {
            query = query.bind(key.consumer()).bind(key.message_id());
        }
        let rows: Vec<MySqlRow> = query.fetch_all(&mut *conn).await.map_err(ReadError::Sql)?;
        let mut now = None;
        let mut last_id = None;
        let mut found = Vec::with_capacity(rows.len());
        for row in &rows {
            let ms: i64 = sqlx::Row::try_get(row, "now_ms").map_err(ReadError::Sql)?;
            now = Some(Timestamp::from_millis(ms));
            last_id = Some(sqlx::Row::try_get(row, "last_id").map_err(ReadError::Sql)?);
            if let Some(key) = key_of(row).map_err(ReadError::Contract)? {
                let stored = decode_stored(row, &key).map_err(ReadError::Contract)?;
                found.push((key, stored));
            }
        }
        let now = match now {
            Some(now) => now,
            None => self.now(conn).await.map_err(ReadError::Sql)?,
        };
        Ok((now, found, last_id))
    }

    /// "Now" (the injected clock's, else the server's), read on `conn`.
    pub(crate) async fn now(
        &self,
        conn: &mut MySqlConnection,
    ) -> std::result::Result<Timestamp, sqlx::Error> {
        let ms: i64 = sqlx::query_scalar(AssertSqlSafe(self.inner.sql.now.clone()))
            .bind(self.now_param())
            .fetch_one(&mut *conn)
            .await?;
        Ok(Timestamp::from_millis(ms))
    }
}

/// The value the statement `done` gave `LAST_INSERT_ID(expr)`: the insert id the server
/// reported, or, when it reported 0, the session's `LAST_INSERT_ID()`, read on `conn`. A
/// trigger (kept counts, `crate::counts`) makes the server report 0 whatever the
/// statement set; the session's value survives it. Without triggers no statement that
/// sets it to more than 0 reports 0, so that read costs nothing then.
pub(crate) async fn last_insert_id(
    conn: &mut MySqlConnection,
    done: &MySqlQueryResult,
) -> std::result::Result<u64, sqlx::Error> {
    match done.last_insert_id() {
        0 => {
            sqlx::query_scalar("SELECT LAST_INSERT_ID()")
                .fetch_one(conn)
                .await
        }
        id => Ok(id),
    }
}

/// Why a read failed: the driver (maybe a lost race), or what it read.
pub(crate) enum ReadError {
    Sql(sqlx::Error),
    Contract(dedup_core::Error),
}

/// The fingerprint as bound.
pub(crate) fn fingerprint_param(fingerprint: Option<&Fingerprint>) -> Option<&str> {
    fingerprint.map(Fingerprint::as_str)
}

#[async_trait]
impl SqlStore for MySqlStore {
    type Backend = Backend;
    type Config = MySqlConfig;
    type Migrations<'a> = Inbox<'a>;

    async fn open_pool(url: &str, config: &MySqlConfig) -> Result<MySqlPool> {
        crate::connect::pool(url, config).await
    }

    async fn over_pool(pool: MySqlPool, config: MySqlConfig) -> Result<Self> {
        Self::from_pool(pool, config).await
    }

    fn store_pool(&self) -> &MySqlPool {
        &self.inner.pool
    }

    fn store_config(&self) -> &MySqlConfig {
        &self.inner.config
    }

    fn migrations(&self) -> Inbox<'_> {
        Inbox::new(&self.inner.pool, &self.inner.config)
    }

    fn tables_migrated(&self) {
        self.inner.outbox.table.migrated();
    }
}
