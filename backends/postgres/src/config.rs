//! [`PostgresConfig`]: where the records live and which clock leases use.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::backend::names::sql_identifier;
use dedup_core::{Clock, Error, MAX_BATCH_LEN, Result, TlsFiles};
use dedup_sql::config::SqlConfig;
use dedup_sql::target::TargetConfig;

/// How a [`PostgresStore`](crate::PostgresStore) is set up.
///
/// Build it with struct-update syntax so new fields keep your code compiling:
///
/// ```
/// use dedup_postgres::PostgresConfig;
/// let config = PostgresConfig { table: "billing_inbox".into(), ..Default::default() };
/// assert_eq!(config.schema, "public");
/// ```
#[derive(Clone, Debug)]
pub struct PostgresConfig {
    /// The schema holding the table (created by [`migrate`](crate::PostgresStore::migrate)
    /// when missing). Default `public`. ASCII letters, digits and `_`, at most 63 bytes.
    pub schema: String,
    /// The table holding the records. Default `dedup_inbox`. Same rules as `schema`.
    pub table: String,
    /// The clock for lease arithmetic. `None` (the default): the PostgreSQL server's clock
    /// (`clock_timestamp()`), so nodes with skewed clocks agree. Inject one (a
    /// [`ManualClock`](dedup_core::ManualClock)) to control expiry in tests.
    pub clock: Option<Arc<dyn Clock>>,
    /// Pool size used by [`PostgresStore::connect`](crate::PostgresStore::connect) and
    /// [`connect_with`](crate::PostgresStore::connect_with) (ignored by `from_pool`).
    /// Default 20: the broker consumers' default 16 messages in flight, each holding a
    /// connection for its whole transaction in transactional mode, plus the 4 that group
    /// commit's statements hold at most (2 × its default 2 rounds). See the crate docs on
    /// sizing: lease mode needs about one connection per concurrent store call;
    /// transactional mode one per message being handled.
    pub max_connections: u32,
    /// How long a store call waits for a pool connection (a free one, or a new one opened
    /// within [`connect_timeout`](Self::connect_timeout)) before it fails with a retryable
    /// [`Error::Backend`] naming the pool timeout. Default 5 s, the connect timeout: longer
    /// than opening one connection takes on a healthy network, and short enough that
    /// during a database outage each attempt fails in seconds (sqlx's own default, 30 s,
    /// held every message that long) and the caller's retry or the broker's redelivery
    /// takes over. Not zero.
    pub acquire_timeout: Duration,
    /// How long [`connect`](crate::PostgresStore::connect) may take to establish its first
    /// connection (TCP, TLS and authentication) before it fails with the cause. Default 5 s.
    pub connect_timeout: Duration,
    /// TLS certificate files, applied on top of the URL's own `sslrootcert`, `sslcert`,
    /// `sslkey`. A CA given here with no `sslmode` in the URL means `sslmode=verify-full`.
    /// TLS needs this crate's `tls` feature.
    pub tls: TlsFiles,
    /// Whether [`connect`](crate::PostgresStore::connect) /
    /// [`connect_with`](crate::PostgresStore::connect_with) create or upgrade the table
    /// ([`migrate`](crate::PostgresStore::migrate)). Default `true`. With `false` they only
    /// check it, writing nothing (a role without the right to create tables can open the
    /// store): a missing or older table is [`Error::SchemaNotMigrated`], a newer one
    /// [`Error::SchemaTooNew`]. For read-only tools such as `dedup stats`.
    pub migrate: bool,
    /// Group commit of single claims and single commits: concurrent
    /// [`claim`](dedup_core::DedupStore::claim) calls on this store share one statement
    /// (and one transaction, so one flush of the server's log) per round, and so do
    /// concurrent [`commit`](dedup_core::DedupStore::commit) calls; each caller gets its own
    /// result, as if it had run alone, once the statement holding its request committed. A
    /// lone caller runs at once, on its own statement. Default: on
    /// ([`GroupCommit::default`]); `None` runs every call on its own statement.
    pub group_commit: Option<GroupCommit>,
    /// The outbox's table ([`PostgresStore::outbox`](crate::PostgresStore::outbox)), in
    /// `schema`, created and migrated with the records table by
    /// [`migrate`](crate::PostgresStore::migrate). `None` (the default): the records
    /// table's name plus `_outbox` (`dedup_inbox_outbox`; see
    /// [`names::outbox_table`](dedup_core::backend::names::outbox_table)). Same rules as
    /// `table`, and not the same name.
    pub outbox_table: Option<String>,
}

/// How [`PostgresConfig::group_commit`] groups concurrent single claims (and, apart,
/// single commits) of one store.
///
/// A call queues its request and waits for one of `rounds` permits; whoever gets one takes
/// every request queued by then (up to `max_requests`) and runs them as one statement.
/// While `rounds` statements of a kind run, new calls of that kind queue behind them, so
/// under load the statements carry many requests each, and with little load each call
/// runs alone at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupCommit {
    /// Statements of one kind (claims, or commits) running at once, at least 1. Default 2:
    /// one statement gathers callers while the other waits for its commit to be durable.
    /// Each running statement holds a pool connection.
    pub rounds: usize,
    /// Most requests one statement carries, 1 to [`MAX_BATCH_LEN`]. Default 256.
    pub max_requests: usize,
}

impl Default for GroupCommit {
    fn default() -> Self {
        GroupCommit {
            rounds: 2,
            max_requests: 256,
        }
    }
}

impl GroupCommit {
    /// Check the bounds.
    pub fn validate(&self) -> Result<()> {
        if self.rounds == 0 {
            return Err(Error::invalid("group_commit.rounds", "must be at least 1"));
        }
        if !(1..=MAX_BATCH_LEN).contains(&self.max_requests) {
            return Err(Error::invalid(
                "group_commit.max_requests",
                format!("must be 1 to {MAX_BATCH_LEN}"),
            ));
        }
        Ok(())
    }
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            schema: "public".into(),
            table: "dedup_inbox".into(),
            clock: None,
            max_connections: 20,
            acquire_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            tls: TlsFiles::default(),
            migrate: true,
            group_commit: Some(GroupCommit::default()),
            outbox_table: None,
        }
    }
}

impl PostgresConfig {
    /// Check the schema and table names (they are spliced into SQL, quoted), the connect
    /// timeout, the group commit bounds and the TLS files.
    pub fn validate(&self) -> Result<()> {
        sql_identifier("schema", &self.schema)?;
        self.validate_settings()?;
        if let Some(group) = &self.group_commit {
            group.validate()?;
        }
        self.tls.validate()
    }

    /// `"schema"."table"`, ready to splice into SQL (call [`validate`](Self::validate) first).
    pub(crate) fn qualified_table(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.table)
    }

    /// `"schema"."outbox table"`, ready to splice into SQL.
    pub(crate) fn qualified_outbox_table(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.outbox_table_name())
    }
}

dedup_sql::sql_config!(PostgresConfig, crate::ddl::VERSIONS_TABLE);

impl TargetConfig for PostgresConfig {
    fn location(&self) -> String {
        format!("table {}.{}", self.schema, self.table)
    }

    fn check(&self) -> Result<()> {
        self.validate()
    }
}
