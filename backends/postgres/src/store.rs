//! [`PostgresStore`]: the [`DedupStore`](dedup_core::DedupStore) over a PostgreSQL table:
//! the type, its constructors and accessors here; its [`Storage`](dedup_core::backend::Storage)
//! implementation in [`storage`], the claim and commit statement rounds on one connection in
//! [`claim_commit`], single claims and commits alone or grouped in [`grouped`].

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use dedup_core::{Claim, ClaimRequest, CommitRequest, Result};
use dedup_sql::SqlStore;
use sqlx::{PgPool, SqlStr};

use crate::config::PostgresConfig;
use crate::error::{Backend, backend};
use crate::group::Grouper;
use crate::outbox_table::OutboxTable;
use crate::schema::Inbox;
use crate::statements::Statements;

mod claim_commit;
mod grouped;
mod storage;

/// A [`DedupStore`](dedup_core::DedupStore) keeping its records in one PostgreSQL table.
///
/// Cheap to clone (the clones share the pool and the group commit queues). Every write is
/// one statement (an answer that writes nothing reads the record with a second one; see the
/// crate docs), and concurrent single claims, and commits, share statements
/// ([`PostgresConfig::group_commit`]); lease time comes from the server's clock unless the
/// [`PostgresConfig`] injects one. [`claim_in_tx`](Self::claim_in_tx) and
/// [`commit_in_tx`](Self::commit_in_tx) join the caller's own transaction.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
    /// This handle's claims commit asynchronously ([`Self::lazy_claims`]).
    lazy_claims: bool,
}

struct Inner {
    pool: PgPool,
    config: PostgresConfig,
    table: String,
    sql: Statements,
    /// The outbox's table ([`PostgresStore::outbox`]).
    outbox: OutboxTable,
    /// Single claims waiting for a grouped statement (`None`: group commit is off).
    claims: Option<Grouper<ClaimRequest, Claim>>,
    /// The same for the claims of [`PostgresStore::lazy_claims`] handles.
    lazy_claims: Option<Grouper<ClaimRequest, Claim>>,
    /// Single commits waiting for a grouped statement (`None`: group commit is off).
    commits: Option<Grouper<CommitRequest, ()>>,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.inner.table)
            .field("clock", &self.inner.config.clock)
            .field("lazy_claims", &self.lazy_claims)
            .field("pool", &self.inner.pool)
            .finish()
    }
}

impl PostgresStore {
    /// Connect to `url` with the default [`PostgresConfig`] and [`migrate`](Self::migrate).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, PostgresConfig::default()).await
    }

    /// Connect to `url` with a pool of `config.max_connections` and
    /// [`migrate`](Self::migrate) (with `config.migrate` false: only check that the table
    /// is at this version's schema, writing nothing).
    ///
    /// The first connection is made at once, within `config.connect_timeout`: a wrong host,
    /// port, role, password, database or TLS setting fails here with the server's or the
    /// operating system's error as the source and a hint in the message.
    pub async fn connect_with(url: &str, config: PostgresConfig) -> Result<Self> {
        dedup_sql::store::connect_with(url, config).await
    }

    /// A store over an existing pool. Validates the names; does not touch the database
    /// (call [`migrate`](Self::migrate) unless the schema is managed elsewhere).
    pub async fn from_pool(pool: PgPool, config: PostgresConfig) -> Result<Self> {
        config.validate()?;
        let table = config.qualified_table();
        let group = config.group_commit;
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                pool,
                sql: crate::ring::statements::for_config(&config),
                outbox: OutboxTable::new(&config),
                table,
                config,
                claims: group.map(|g| Grouper::new(g.rounds, g.max_requests)),
                lazy_claims: group.map(|g| Grouper::new(g.rounds, g.max_requests)),
                commits: group.map(|g| Grouper::new(g.rounds, g.max_requests)),
            }),
            lazy_claims: false,
        })
    }

    /// Create the schema, the records and outbox tables and their indexes when missing. Idempotent, and safe to run from
    /// many nodes at once (they take turns under an advisory lock).
    pub async fn migrate(&self) -> Result<()> {
        dedup_sql::store::migrate(self).await
    }

    /// A handle on the same store (pool, table, queues) whose lease-mode claims
    /// ([`claim`](dedup_core::DedupStore::claim), `claim_many`) commit asynchronously:
    /// each claim statement sets `synchronous_commit = off` for its own transaction (see
    /// [`crate::statements::LAZY_COMMIT`]), so it returns once written, without waiting for
    /// the log flush. Everything else (commits, renewals, releases, reads) is unchanged.
    ///
    /// For [`TxInbox`](crate::TxInbox)'s attempt-counting claim only: a server crash can
    /// lose such a claim unless a later durable commit on the server flushed the log past
    /// it (the log is flushed in order).
    pub(crate) fn lazy_claims(&self) -> PostgresStore {
        PostgresStore {
            inner: Arc::clone(&self.inner),
            lazy_claims: true,
        }
    }

    /// This handle's single and many-key claim statements: the lazy forms for a
    /// [`lazy_claims`](Self::lazy_claims) handle.
    fn claim_statements(&self) -> (&SqlStr, &SqlStr) {
        let sql = &self.inner.sql;
        if self.lazy_claims {
            (&sql.claim_lazy, &sql.claim_many_lazy)
        } else {
            (&sql.claim, &sql.claim_many)
        }
    }

    /// This handle's fresh-key claim statement: the lazy form for a
    /// [`lazy_claims`](Self::lazy_claims) handle.
    fn claim_fresh_statement(&self) -> &SqlStr {
        let sql = &self.inner.sql;
        if self.lazy_claims {
            &sql.claim_fresh_lazy
        } else {
            &sql.claim_fresh
        }
    }

    pub(crate) fn outbox_table(&self) -> &OutboxTable {
        &self.inner.outbox
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The configuration this store was built with.
    pub fn config(&self) -> &PostgresConfig {
        &self.inner.config
    }

    /// The `"schema"."table"` this store uses, quoted.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    pub(crate) fn statements(&self) -> &Statements {
        &self.inner.sql
    }

    /// The injected clock's time, bound as `$1` (NULL: the server's clock).
    pub(crate) fn now_param(&self) -> Option<i64> {
        self.inner.config.now_param()
    }

    async fn conn(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>> {
        // Boxed: sqlx's acquire future is about 2.5 KiB, and every future that awaits a
        // connection (claim, commit, their groups) would carry it inline and copy it at each
        // move: a third of the client's instructions per claim+commit went to that memcpy
        // (callgrind). One allocation per acquire is far cheaper.
        Box::pin(self.inner.pool.acquire()).await.map_err(backend)
    }
}

#[async_trait]
impl SqlStore for PostgresStore {
    type Backend = Backend;
    type Config = PostgresConfig;
    type Migrations<'a> = Inbox<'a>;

    async fn open_pool(url: &str, config: &PostgresConfig) -> Result<PgPool> {
        crate::connect::pool(url, config).await
    }

    async fn over_pool(pool: PgPool, config: PostgresConfig) -> Result<Self> {
        Self::from_pool(pool, config).await
    }

    fn store_pool(&self) -> &PgPool {
        &self.inner.pool
    }

    fn store_config(&self) -> &PostgresConfig {
        &self.inner.config
    }

    fn migrations(&self) -> Inbox<'_> {
        Inbox::new(&self.inner.pool, &self.inner.config)
    }

    fn tables_migrated(&self) {
        self.inner.outbox.table.migrated();
    }
}
