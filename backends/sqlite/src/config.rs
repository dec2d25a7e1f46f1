//! [`SqliteConfig`] and [`Synchronous`]: how a [`SqliteStore`](crate::SqliteStore) opens its
//! database.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::backend::names;
use dedup_core::{Clock, Error, Result};

/// The table every store uses unless configured otherwise.
pub const DEFAULT_TABLE: &str = "dedup_inbox";

/// The table that records the schema version of every dedup table in a database file.
pub const SCHEMA_VERSIONS_TABLE: &str = "dedup_schema_versions";

/// The table that keeps the last purge run of every records table in a database file
/// (created by schema version 5).
pub const PURGE_RUNS_TABLE: &str = "dedup_purge_runs";

/// How a [`SqliteStore`](crate::SqliteStore) opens its database.
///
/// ```
/// use std::time::Duration;
/// use dedup_sqlite::{SqliteConfig, Synchronous};
///
/// let config = SqliteConfig {
///     table: "billing_inbox".into(),
///     synchronous: Synchronous::Normal,
///     busy_timeout: Duration::from_secs(10),
///     ..SqliteConfig::default()
/// };
/// assert_eq!(config.pool_size, 4);
/// ```
#[derive(Clone, Debug)]
pub struct SqliteConfig {
    /// The table holding the records (created and migrated by the store). ASCII letters,
    /// digits and `_`, starting with a letter or `_`, at most 63 bytes, not starting with
    /// `sqlite_` and not [`SCHEMA_VERSIONS_TABLE`] or [`PURGE_RUNS_TABLE`]. Default
    /// `dedup_inbox`.
    pub table: String,
    /// How hard SQLite pushes each commit to the disk. Default [`Synchronous::Full`].
    pub synchronous: Synchronous,
    /// How long an operation waits for another connection or process that holds the write
    /// lock before failing with a retryable [`Error::Backend`]. Default 5 s.
    pub busy_timeout: Duration,
    /// The clock for lease arithmetic. `None` (the default): the system clock. Tests inject a
    /// [`ManualClock`](dedup_core::ManualClock) to control expiry without sleeping.
    pub clock: Option<Arc<dyn Clock>>,
    /// How many connections (and so blocking threads) the store uses at most. Writes
    /// serialise inside SQLite anyway; more connections let reads (`get`) run beside a
    /// write. Default 4. An in-memory store always uses exactly one connection.
    pub pool_size: usize,
    /// Where the store's SQLite calls run on a multi-threaded tokio runtime. `true` (the
    /// default): on the calling worker thread, which tokio's `block_in_place` first turns
    /// into a blocking thread (its other tasks move to another worker), saving the two
    /// thread hand-overs of `spawn_blocking` (about 30 µs a call here, a third of a claim
    /// on a quiet store). `false`: on tokio's blocking pool. On a current-thread runtime
    /// the blocking pool is always used.
    ///
    /// What `true` changes for a caller: a timeout the caller wraps around one store call
    /// (`tokio::time::timeout`) fires only once the SQLite call returns, i.e. after at most
    /// [`busy_timeout`](Self::busy_timeout) waiting for another process's lock, where with
    /// `false` it fires on time while the call finishes in the background. Other tasks
    /// are never held up either way. Waiting for this store's own write queue is
    /// asynchronous in both modes.
    pub block_in_place: bool,
    /// Whether opening the store creates or upgrades its table. Default `true`. With
    /// `false` it only checks it, writing no schema: a missing or older table is
    /// [`Error::SchemaNotMigrated`], a newer one [`Error::SchemaTooNew`]. For read-only
    /// tools such as `dedup stats`.
    pub migrate: bool,
    /// The outbox's table ([`SqliteStore::outbox`](crate::SqliteStore::outbox)), created and
    /// migrated with the records table. `None` (the default): the records table's name plus
    /// `_outbox` (`dedup_inbox_outbox`; see
    /// [`names::outbox_table`](dedup_core::backend::names::outbox_table)). Same rules as
    /// [`table`](Self::table), and not the same name.
    pub outbox_table: Option<String>,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        SqliteConfig {
            table: DEFAULT_TABLE.to_owned(),
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(5),
            clock: None,
            pool_size: 4,
            block_in_place: true,
            migrate: true,
            outbox_table: None,
        }
    }
}

impl SqliteConfig {
    /// The default configuration with another table name.
    pub fn with_table(table: impl Into<String>) -> Self {
        SqliteConfig {
            table: table.into(),
            ..SqliteConfig::default()
        }
    }

    /// Check the configuration: a safe table name, a pool of 1 to 64 connections, a busy
    /// timeout SQLite can represent (at most `i32::MAX` milliseconds).
    pub fn validate(&self) -> Result<()> {
        table_name("table", &self.table)?;
        if let Some(outbox) = &self.outbox_table {
            table_name("outbox table", outbox)?;
            if outbox.eq_ignore_ascii_case(&self.table) {
                return Err(Error::invalid(
                    "outbox table",
                    format!("{outbox:?} is the records table"),
                ));
            }
        }
        if !(1..=64).contains(&self.pool_size) {
            return Err(Error::invalid(
                "pool size",
                format!("{} is outside 1..=64", self.pool_size),
            ));
        }
        if self.busy_timeout.as_millis() > i32::MAX as u128 {
            return Err(Error::invalid(
                "busy timeout",
                format!(
                    "{:?} is longer than i32::MAX milliseconds",
                    self.busy_timeout
                ),
            ));
        }
        Ok(())
    }
}

impl SqliteConfig {
    /// The outbox's table: [`outbox_table`](Self::outbox_table), or the name derived from
    /// [`table`](Self::table).
    pub fn outbox_table_name(&self) -> String {
        self.outbox_table
            .clone()
            .unwrap_or_else(|| names::outbox_table(&self.table))
    }
}

/// A table name the store may splice into SQL: a safe identifier, not SQLite's own and not
/// the versions table.
fn table_name(what: &'static str, table: &str) -> Result<()> {
    names::sql_identifier(what, table)?;
    if table.to_ascii_lowercase().starts_with("sqlite_") {
        return Err(Error::invalid(
            what,
            format!("{table:?}: names starting with sqlite_ are reserved by SQLite"),
        ));
    }
    if table.eq_ignore_ascii_case(SCHEMA_VERSIONS_TABLE) {
        return Err(Error::invalid(
            what,
            format!("{SCHEMA_VERSIONS_TABLE:?} is the store's own schema version table"),
        ));
    }
    if table.eq_ignore_ascii_case(PURGE_RUNS_TABLE) {
        return Err(Error::invalid(
            what,
            format!("{PURGE_RUNS_TABLE:?} is the store's own purge run table"),
        ));
    }
    Ok(())
}

/// SQLite's `PRAGMA synchronous` in WAL mode: what a committed claim survives.
///
/// | setting | process crash | power loss / OS crash | cost |
/// |---|---|---|---|
/// | [`Full`](Self::Full) (default) | kept | kept | one `fsync` of the WAL per commit |
/// | [`Normal`](Self::Normal) | kept | the last commits before the loss may be rolled back | `fsync` only at checkpoints |
///
/// With `Normal`, a power loss can undo the most recent commits: their messages are then
/// processed again on redelivery (at-least-once), and a claim that was acknowledged may be
/// forgotten, so a takeover can happen before the lease ran out. The database itself is
/// never corrupted by either setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Synchronous {
    /// `PRAGMA synchronous = FULL`: every commit is on the disk before it returns.
    #[default]
    Full,
    /// `PRAGMA synchronous = NORMAL`: faster; commits since the last checkpoint may be lost
    /// on power loss (not on a process crash).
    Normal,
}

impl Synchronous {
    /// The pragma value.
    pub(crate) fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_validated() {
        SqliteConfig::default().validate().unwrap();
        SqliteConfig::with_table("_billing_1").validate().unwrap();
        for bad in [
            "",
            "1x",
            "a-b",
            "x\"; DROP TABLE y; --",
            "sqlite_master",
            "SQLITE_x",
            "dedup_schema_versions",
        ] {
            let err = SqliteConfig::with_table(bad).validate().unwrap_err();
            assert!(err.is_invalid_input(), "{bad:?} gave {err:?}");
        }
    }

    #[test]
    fn outbox_table_names_are_validated() {
        assert_eq!(
            SqliteConfig::default().outbox_table_name(),
            "dedup_inbox_outbox"
        );
        for bad in ["dedup_inbox", "sqlite_x", "dedup_schema_versions", "a b"] {
            let config = SqliteConfig {
                outbox_table: Some(bad.into()),
                ..SqliteConfig::default()
            };
            assert!(config.validate().unwrap_err().is_invalid_input(), "{bad}");
        }
    }

    #[test]
    fn pool_size_and_timeout_are_validated() {
        for pool_size in [0, 65] {
            let config = SqliteConfig {
                pool_size,
                ..SqliteConfig::default()
            };
            assert!(config.validate().unwrap_err().is_invalid_input());
        }
        let config = SqliteConfig {
            busy_timeout: Duration::from_secs(u64::MAX / 2),
            ..SqliteConfig::default()
        };
        assert!(config.validate().unwrap_err().is_invalid_input());
    }
}
