//! [`SqlSettings`]: the settings every sqlx backend's configuration holds (the records
//! table, the clock, the pool, the timeouts, TLS, migrating, the outbox table), declared
//! and checked once here. Each backend's configuration is its own public struct that holds
//! them in its `sql` field and reaches them through `Deref` ([`SqlConfig`]).

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use dedup_core::backend::names::{outbox_table, sql_identifier};
use dedup_core::backend::url::{Params, UrlError};
use dedup_core::{Clock, Error, Result, TlsFiles};

/// The records table's default name.
pub const DEFAULT_TABLE: &str = "dedup_inbox";

/// A configuration's injected clock.
pub type SharedClock = Arc<dyn Clock>;

/// The table keeping the last purge run of each records table beside it (in the schema on
/// PostgreSQL, the database on MySQL): one row per records table, created by the records
/// table's migrations and replaced by every purge that finishes.
pub const PURGE_RUNS_TABLE: &str = "dedup_purge_runs";

/// The settings every sqlx store shares, held by its configuration
/// (`PostgresConfig::sql`, `MySqlConfig::sql`).
///
/// Build it with struct-update syntax so new fields keep your code compiling:
///
/// ```
/// use dedup_sql::config::SqlSettings;
/// let sql = SqlSettings { table: "billing_inbox".into(), ..Default::default() };
/// assert_eq!(sql.max_connections, 20);
/// ```
#[derive(Clone, Debug)]
pub struct SqlSettings {
    /// The table holding the records: in the configuration's schema on PostgreSQL, in the
    /// connection's database on MySQL. Default `dedup_inbox`. ASCII letters, digits and
    /// `_`, at most 63 bytes.
    pub table: String,
    /// The clock for lease arithmetic. `None` (the default): the server's clock
    /// (PostgreSQL's `clock_timestamp()`, MySQL's `UTC_TIMESTAMP(6)`), so nodes with
    /// skewed clocks agree. Inject one (a [`ManualClock`](dedup_core::ManualClock)) to
    /// control expiry in tests.
    pub clock: Option<SharedClock>,
    /// The pool size `connect` and `connect_with` open (`from_pool` ignores it). Default
    /// 20: the broker consumers' default 16 messages in flight, each holding a connection
    /// for its whole transaction in transactional mode, plus a margin. PostgreSQL's group
    /// commit holds at most 4 of them (2 × its default 2 rounds). The purger and the
    /// operator's reads take one each while they run. Lease mode needs about one
    /// connection per concurrent store call.
    pub max_connections: u32,
    /// How long a store call waits for a pool connection before it fails. It waits for a
    /// free one, or a new one opened within [`connect_timeout`](Self::connect_timeout).
    /// It then fails with a retryable [`Error::Backend`] naming the pool timeout. Default
    /// 5 s, the connect timeout: longer than opening one connection takes on a healthy
    /// network. During a database outage each attempt so fails in seconds, and the
    /// caller's retry or the broker's redelivery takes over (sqlx's own 30 s held every
    /// message that long). Not zero.
    pub acquire_timeout: Duration,
    /// How long `connect` may take to open its first connection (TCP, TLS and
    /// authentication) before it fails with the cause. Default 5 s. Not zero.
    pub connect_timeout: Duration,
    /// TLS certificate files, applied on top of the URL's own. Those are PostgreSQL's
    /// `sslrootcert`, `sslcert`, `sslkey` and MySQL's `ssl-ca`, `ssl-cert`, `ssl-key`. A
    /// CA given here with no TLS mode in the URL verifies the server fully
    /// (`sslmode=verify-full`, `ssl-mode=VERIFY_IDENTITY`). TLS needs the backend crate's
    /// `tls` feature.
    pub tls: TlsFiles,
    /// Whether `connect` and `connect_with` create or upgrade the tables (the store's
    /// `migrate`). Default `true`. With `false` they only check them, writing nothing, so
    /// a role without the right to create tables can open the store. A missing or older
    /// table is then [`Error::SchemaNotMigrated`], a newer one [`Error::SchemaTooNew`].
    /// For read-only tools such as `dedup stats`.
    pub migrate: bool,
    /// The outbox's table (the store's `outbox()`), beside the records table, created and
    /// migrated with it. `None` (the default): the records table's name plus `_outbox`
    /// (`dedup_inbox_outbox`; see
    /// [`names::outbox_table`](dedup_core::backend::names::outbox_table)). Same rules as
    /// [`table`](Self::table), and not the same name.
    pub outbox_table: Option<String>,
}

impl Default for SqlSettings {
    fn default() -> Self {
        SqlSettings {
            table: DEFAULT_TABLE.into(),
            clock: None,
            max_connections: 20,
            acquire_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            tls: TlsFiles::default(),
            migrate: true,
            outbox_table: None,
        }
    }
}

impl SqlSettings {
    /// Check the settings: the table names (spliced into SQL, quoted), the outbox table
    /// apart from the store's other tables (`versions_table` and [`PURGE_RUNS_TABLE`]),
    /// the timeouts not zero, the TLS files.
    pub fn validate(&self, versions_table: &str) -> Result<()> {
        sql_identifier("table", &self.table)?;
        if self.table == PURGE_RUNS_TABLE {
            return Err(Error::invalid(
                "table",
                format!("{:?} is the store's own purge run table", self.table),
            ));
        }
        if let Some(outbox) = &self.outbox_table {
            sql_identifier("outbox table", outbox)?;
            if *outbox == self.table || outbox == versions_table || outbox == PURGE_RUNS_TABLE {
                return Err(Error::invalid(
                    "outbox table",
                    format!("{outbox:?} is one of the store's other tables"),
                ));
            }
        }
        if self.connect_timeout.is_zero() {
            return Err(Error::invalid("connect_timeout", "must not be zero"));
        }
        if self.acquire_timeout.is_zero() {
            return Err(Error::invalid("acquire_timeout", "must not be zero"));
        }
        self.tls.validate()
    }

    /// The outbox's table name: [`outbox_table`](Self::outbox_table), or the name derived
    /// from [`table`](Self::table).
    pub fn outbox_table_name(&self) -> String {
        self.outbox_table
            .clone()
            .unwrap_or_else(|| outbox_table(&self.table))
    }

    /// The injected clock's reading in ms since the Unix epoch, as the statements bind
    /// "now" (`None`, bound as `NULL`: the server's clock).
    pub fn now_param(&self) -> Option<i64> {
        self.clock.as_ref().map(|c| c.now().as_millis())
    }
}

/// A sqlx backend's configuration as the shared layer sees it: the [`SqlSettings`] it
/// holds, reached through `Deref` (so `config.table` reads the shared field), and the
/// name of its versions table.
pub trait SqlConfig: Default + Deref<Target = SqlSettings> + DerefMut {
    /// The table recording each store table's schema version (no outbox may take its name).
    const VERSIONS_TABLE: &'static str;

    /// Check the shared settings ([`SqlSettings::validate`]).
    fn validate_settings(&self) -> Result<()> {
        self.deref().validate(Self::VERSIONS_TABLE)
    }

    /// The default configuration with the shared settings taken from `params`
    /// ([`SqlSettings::from_params`]).
    fn from_params(params: &mut Params) -> std::result::Result<Self, UrlError> {
        let mut config = Self::default();
        *config.deref_mut() = SqlSettings::from_params(params)?;
        Ok(config)
    }

    /// This configuration with [`max_connections`](SqlSettings::max_connections) set to
    /// `n`.
    fn with_max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// This configuration with [`acquire_timeout`](SqlSettings::acquire_timeout) set to
    /// `timeout`.
    fn with_acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }
}

/// A store's whole configuration, as [`SqlTarget`](crate::target::SqlTarget) and
/// [`SqlStore`](crate::SqlStore) use it: the shared settings and the backend's own.
pub trait TargetConfig: SqlConfig + Clone + std::fmt::Debug + Send + Sync + 'static {
    /// Where the records are kept, for people (`table public.dedup_inbox`).
    fn location(&self) -> String;

    /// Check the whole configuration (the backend's `validate`).
    fn check(&self) -> Result<()>;
}
