//! [`MySqlConfig`]: where the records live and which clock leases use.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::{Clock, Result, TlsFiles};
use dedup_sql::config::SqlConfig;
use dedup_sql::target::TargetConfig;

/// The table recording each store table's schema version, one per database.
pub const VERSIONS_TABLE: &str = "dedup_schema_versions";

/// How a [`MySqlStore`](crate::MySqlStore) is set up.
///
/// Build it with struct-update syntax so new fields keep your code compiling:
///
/// ```
/// use dedup_mysql::MySqlConfig;
/// let config = MySqlConfig { table: "billing_inbox".into(), ..Default::default() };
/// assert_eq!(config.max_connections, 20);
/// ```
#[derive(Clone, Debug)]
pub struct MySqlConfig {
    /// The table holding the records, in the connection's database. Default
    /// `dedup_inbox`. ASCII letters, digits and `_`, at most 63 bytes.
    pub table: String,
    /// The clock for lease arithmetic. `None` (the default): the server's clock
    /// (`UTC_TIMESTAMP(6)`), so nodes with skewed clocks agree. Inject one (a
    /// [`ManualClock`](dedup_core::ManualClock)) to control expiry in tests.
    pub clock: Option<Arc<dyn Clock>>,
    /// Pool size used by [`MySqlStore::connect`](crate::MySqlStore::connect) and
    /// [`connect_with`](crate::MySqlStore::connect_with) (ignored by `from_pool`). Default
    /// 20: the broker consumers' default 16 messages in flight, each holding a connection
    /// for its whole transaction in transactional mode, and a margin for the purger, the
    /// operator's reads and calls outside the transaction.
    pub max_connections: u32,
    /// How long a store call waits for a pool connection (a free one, or a new one opened
    /// within [`connect_timeout`](Self::connect_timeout)) before it fails with a retryable
    /// [`Error::Backend`](dedup_core::Error::Backend) naming the pool timeout. Default 5 s,
    /// the connect timeout: longer than opening one connection takes on a healthy network,
    /// and short enough that
    /// during a database outage each attempt fails in seconds (sqlx's own default, 30 s,
    /// held every message that long) and the caller's retry or the broker's redelivery
    /// takes over. Not zero.
    pub acquire_timeout: Duration,
    /// How long [`connect`](crate::MySqlStore::connect) may take to establish its first
    /// connection (TCP, TLS and authentication) before it fails with the cause. Default 5 s.
    pub connect_timeout: Duration,
    /// TLS certificate files, applied on top of the URL's own `ssl-ca`, `ssl-cert`,
    /// `ssl-key`. A CA given here with no `ssl-mode` in the URL means `VERIFY_IDENTITY`.
    /// TLS needs this crate's `tls` feature.
    pub tls: TlsFiles,
    /// Whether [`connect`](crate::MySqlStore::connect) /
    /// [`connect_with`](crate::MySqlStore::connect_with) create or upgrade the table
    /// ([`migrate`](crate::MySqlStore::migrate)). Default `true`. With `false` they only
    /// check it, writing nothing: a missing or older table is
    /// [`Error::SchemaNotMigrated`](dedup_core::Error::SchemaNotMigrated), a newer one
    /// [`Error::SchemaTooNew`](dedup_core::Error::SchemaTooNew).
    pub migrate: bool,
    /// The outbox's table ([`MySqlStore::outbox`](crate::MySqlStore::outbox)), in the
    /// connection's database, created and migrated with the records table by
    /// [`migrate`](crate::MySqlStore::migrate). `None` (the default): the records table's
    /// name plus `_outbox` (`dedup_inbox_outbox`; see
    /// [`names::outbox_table`](dedup_core::backend::names::outbox_table)). Same rules as
    /// `table`, and not the same name.
    pub outbox_table: Option<String>,
}

impl Default for MySqlConfig {
    fn default() -> Self {
        MySqlConfig {
            table: "dedup_inbox".into(),
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

impl MySqlConfig {
    /// Check the table name (it is spliced into SQL, quoted), the connect timeout and the
    /// TLS files.
    pub fn validate(&self) -> Result<()> {
        self.validate_settings()?;
        self.tls.validate()
    }

    /// The tables a store on this configuration creates in its database: the records
    /// table, the outbox table and the outbox's ordering keys table (`<outbox>_keys`). The
    /// shared `dedup_schema_versions` and `dedup_purge_runs` tables are not among them.
    /// For a tool that drops a store it made (a test's).
    pub fn table_names(&self) -> Vec<String> {
        let outbox = self.outbox_table_name();
        let keys = crate::outbox_schema::keys_table_name(&outbox);
        vec![self.table.clone(), outbox, keys]
    }

    /// `` `table` ``, ready to splice into SQL (call [`validate`](Self::validate) first).
    pub(crate) fn quoted_table(&self) -> String {
        format!("`{}`", self.table)
    }
}

dedup_sql::sql_config!(MySqlConfig, VERSIONS_TABLE);

impl TargetConfig for MySqlConfig {
    fn location(&self) -> String {
        format!("table {}", self.table)
    }

    fn check(&self) -> Result<()> {
        self.validate()
    }
}
