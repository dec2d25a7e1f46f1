//! [`MySqlConfig`]: where the records live and which clock leases use.

use std::ops::{Deref, DerefMut};

use dedup_core::Result;
use dedup_sql::config::{SqlConfig, SqlSettings};
use dedup_sql::target::TargetConfig;

/// The table recording each store table's schema version, one per database.
pub const VERSIONS_TABLE: &str = "dedup_schema_versions";

/// How a [`MySqlStore`](crate::MySqlStore) is set up: the [`SqlSettings`] every sqlx store
/// shares, in [`sql`](Self::sql). MySQL has no settings of its own yet.
///
/// Build it from its [`SqlSettings`] (`From`), or with struct-update syntax once it has
/// settings of its own. The shared settings read through `Deref`: `config.table` is
/// `config.sql.table`.
///
/// ```
/// use dedup_mysql::{MySqlConfig, SqlSettings};
/// let config = MySqlConfig::from(SqlSettings { table: "billing_inbox".into(), ..Default::default() });
/// assert_eq!((config.table.as_str(), config.max_connections), ("billing_inbox", 20));
/// ```
#[derive(Clone, Debug, Default)]
pub struct MySqlConfig {
    /// The settings every sqlx store shares: the records and outbox tables (in the
    /// connection's database), the clock (default: the server's `UTC_TIMESTAMP(6)`), the
    /// pool, the timeouts, TLS, migrating.
    pub sql: SqlSettings,
}

impl MySqlConfig {
    /// Check the shared settings ([`SqlSettings::validate`]: table names, timeouts, TLS
    /// files).
    pub fn validate(&self) -> Result<()> {
        self.validate_settings()
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

impl From<SqlSettings> for MySqlConfig {
    /// The configuration with these shared settings.
    fn from(sql: SqlSettings) -> Self {
        MySqlConfig { sql }
    }
}

impl Deref for MySqlConfig {
    type Target = SqlSettings;

    fn deref(&self) -> &SqlSettings {
        &self.sql
    }
}

impl DerefMut for MySqlConfig {
    fn deref_mut(&mut self) -> &mut SqlSettings {
        &mut self.sql
    }
}

impl SqlConfig for MySqlConfig {
    const VERSIONS_TABLE: &'static str = VERSIONS_TABLE;
}

impl TargetConfig for MySqlConfig {
    fn location(&self) -> String {
        format!("table {}", self.table)
    }

    fn check(&self) -> Result<()> {
        self.validate()
    }
}
