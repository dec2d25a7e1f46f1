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
        let keys = keys_table_name(&outbox);
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

/// The name of the table of `outbox`'s ordering keys: `<outbox>_keys` (see
/// [`suffixed_name`]).
pub(crate) fn keys_table_name(outbox: &str) -> String {
    suffixed_name(outbox, "_keys")
}

/// `<name><suffix>`, or, when that is over MySQL's 64 characters (the limit of table,
/// index and trigger names), `name` cut to fit, `_`, a 16-digit hash of the whole name
/// and `suffix`.
pub(crate) fn suffixed_name(name: &str, suffix: &str) -> String {
    let full = format!("{name}{suffix}");
    if full.len() <= 64 {
        return full;
    }
    // FNV-1a, 64 bits: stable across Rust releases and nodes. Names are ASCII, so any
    // byte index is a character boundary.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let keep = 64 - 17 - suffix.len();
    format!("{}_{hash:016x}{suffix}", &name[..keep.min(name.len())])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_table_names_fit_mysql() {
        assert_eq!(
            keys_table_name("dedup_inbox_outbox"),
            "dedup_inbox_outbox_keys"
        );
        let long = "a".repeat(63);
        let name = keys_table_name(&long);
        assert_eq!(name.len(), 64, "{name}");
        assert_ne!(name, keys_table_name(&format!("{}b", "a".repeat(62))));
    }
}
