//! [`SqlConfig`]: the settings every sqlx backend's configuration has (the records table,
//! the clock, the pool, migrating, the outbox table), read and checked once here. Each
//! backend's configuration is its own public struct (users build it with struct-update
//! syntax); [`sql_config!`](crate::sql_config) gives it the shared accessors, builders and
//! checks.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::backend::names::{outbox_table, sql_identifier};
use dedup_core::backend::url::{Params, UrlError, boolean, count, duration};
use dedup_core::{Clock, Error, Result};

/// The records table's default name.
pub const DEFAULT_TABLE: &str = "dedup_inbox";

/// A configuration's injected clock.
pub type SharedClock = Arc<dyn Clock>;

/// The shared settings of a configuration, borrowed mutably.
pub struct SettingsMut<'a> {
    /// The records table.
    pub table: &'a mut String,
    /// The injected clock (`None`: the server's).
    pub clock: &'a mut Option<Arc<dyn Clock>>,
    /// The pool's size.
    pub max_connections: &'a mut u32,
    /// How long a store call waits for a pool connection.
    pub acquire_timeout: &'a mut Duration,
    /// How long the first connection may take.
    pub connect_timeout: &'a mut Duration,
    /// Whether connecting creates or upgrades the tables.
    pub migrate: &'a mut bool,
}

/// The shared settings of a configuration, borrowed.
pub struct Settings<'a> {
    /// The records table.
    pub table: &'a str,
    /// The outbox table, when set apart from the derived name.
    pub outbox_table: Option<&'a str>,
    /// How long a store call waits for a pool connection.
    pub acquire_timeout: Duration,
    /// How long the first connection may take.
    pub connect_timeout: Duration,
    /// Whether connecting creates or upgrades the tables (else it only checks them).
    pub migrate: bool,
}

/// The table keeping the last purge run of each records table beside it (in the schema on
/// PostgreSQL, the database on MySQL): one row per records table, created by the records
/// table's migrations and replaced by every purge that finishes.
pub const PURGE_RUNS_TABLE: &str = "dedup_purge_runs";

/// A sqlx backend's configuration as the shared layer sees it. Implement it with
/// [`sql_config!`](crate::sql_config), on a struct with the fields `table`, `clock`,
/// `max_connections`, `acquire_timeout`, `connect_timeout`, `migrate` and `outbox_table`.
pub trait SqlConfig: Default {
    /// The table recording each store table's schema version (no outbox may take its name).
    const VERSIONS_TABLE: &'static str;

    /// The shared settings, borrowed.
    fn settings(&self) -> Settings<'_>;

    /// The shared settings, borrowed mutably.
    fn settings_mut(&mut self) -> SettingsMut<'_>;

    /// The injected clock (`None`: the server's).
    fn clock(&self) -> Option<&SharedClock>;

    /// The injected clock's reading in ms since the Unix epoch, as the statements bind
    /// "now" (`None`, bound as `NULL`: the server's clock).
    fn now_param(&self) -> Option<i64> {
        self.clock().map(|c| c.now().as_millis())
    }

    /// Check the shared settings: the table names (spliced into SQL, quoted), the outbox
    /// table apart from the store's other tables, neither of them the [`PURGE_RUNS_TABLE`], the
    /// timeouts not zero.
    fn validate_settings(&self) -> Result<()> {
        let s = self.settings();
        sql_identifier("table", s.table)?;
        if s.table == PURGE_RUNS_TABLE {
            return Err(Error::invalid(
                "table",
                format!("{:?} is the store's own purge run table", s.table),
            ));
        }
        if let Some(outbox) = s.outbox_table {
            sql_identifier("outbox table", outbox)?;
            if outbox == s.table || outbox == Self::VERSIONS_TABLE || outbox == PURGE_RUNS_TABLE {
                return Err(Error::invalid(
                    "outbox table",
                    format!("{outbox:?} is one of the store's other tables"),
                ));
            }
        }
        if s.connect_timeout.is_zero() {
            return Err(Error::invalid("connect_timeout", "must not be zero"));
        }
        if s.acquire_timeout.is_zero() {
            return Err(Error::invalid("acquire_timeout", "must not be zero"));
        }
        Ok(())
    }

    /// The outbox's table name: the one set, or the name derived from the records table's.
    fn outbox_name(&self) -> String {
        let s = self.settings();
        s.outbox_table
            .map(str::to_owned)
            .unwrap_or_else(|| outbox_table(s.table))
    }

    /// The default configuration with the URL parameters every sqlx backend takes from
    /// `params`: `clock`, `table`, `pool_size`, `acquire_timeout`, `connect_timeout`,
    /// `migrate`.
    fn from_params(params: &mut Params) -> std::result::Result<Self, UrlError> {
        let mut config = Self::default();
        let s = config.settings_mut();
        *s.clock = params.server_or_local_clock()?;
        if let Some(table) = params.take("table") {
            *s.table = table;
        }
        if let Some(n) = params.take_with("pool_size", count)? {
            *s.max_connections = n;
        }
        if let Some(t) = params.take_with("acquire_timeout", duration)? {
            *s.acquire_timeout = t;
        }
        if let Some(t) = params.take_with("connect_timeout", duration)? {
            *s.connect_timeout = t;
        }
        if let Some(migrate) = params.take_with("migrate", boolean)? {
            *s.migrate = migrate;
        }
        Ok(config)
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

/// A backend's list of URL parameters: `$first` (its own that come first), the ones every
/// sqlx store takes ([`SqlConfig::from_params`]: `table`, `pool_size`, `acquire_timeout`,
/// `clock`, `connect_timeout`, `migrate`), then `$rest` (its own, then the driver's), as a
/// `&'static [&'static str]` for `Params::parse` (which names them, in this order, when it
/// refuses an unknown one).
#[macro_export]
macro_rules! sql_params {
    ([$($first:literal),* $(,)?], [$($rest:literal),* $(,)?]) => {
        &[
            $($first,)*
            "table",
            "pool_size",
            "acquire_timeout",
            "clock",
            "connect_timeout",
            "migrate",
            $($rest,)*
        ]
    };
}

/// Implement [`SqlConfig`] for a backend's configuration `$config` (a struct with the
/// shared fields, see [`SqlConfig`]) whose versions table is `$versions`, and give it the
/// shared builders (`with_acquire_timeout`, `with_max_connections`) and
/// `outbox_table_name`. Field access on two distinct public structs is what generics
/// cannot do; the logic behind it is [`SqlConfig`]'s.
#[macro_export]
macro_rules! sql_config {
    ($config:ty, $versions:expr) => {
        impl $crate::config::SqlConfig for $config {
            const VERSIONS_TABLE: &'static str = $versions;

            fn settings(&self) -> $crate::config::Settings<'_> {
                $crate::config::Settings {
                    table: &self.table,
                    outbox_table: self.outbox_table.as_deref(),
                    acquire_timeout: self.acquire_timeout,
                    connect_timeout: self.connect_timeout,
                    migrate: self.migrate,
                }
            }

            fn clock(&self) -> Option<&$crate::config::SharedClock> {
                self.clock.as_ref()
            }

            fn settings_mut(&mut self) -> $crate::config::SettingsMut<'_> {
                $crate::config::SettingsMut {
                    table: &mut self.table,
                    clock: &mut self.clock,
                    max_connections: &mut self.max_connections,
                    acquire_timeout: &mut self.acquire_timeout,
                    connect_timeout: &mut self.connect_timeout,
                    migrate: &mut self.migrate,
                }
            }
        }

        impl $config {
            /// This configuration with [`acquire_timeout`](Self::acquire_timeout) set to
            /// `timeout`.
            pub fn with_acquire_timeout(mut self, timeout: std::time::Duration) -> Self {
                self.acquire_timeout = timeout;
                self
            }

            /// This configuration with [`max_connections`](Self::max_connections) set to `n`.
            pub fn with_max_connections(mut self, n: u32) -> Self {
                self.max_connections = n;
                self
            }

            /// The outbox's table name: [`outbox_table`](Self::outbox_table), or the name
            /// derived from [`table`](Self::table).
            pub fn outbox_table_name(&self) -> String {
                $crate::config::SqlConfig::outbox_name(self)
            }
        }
    };
}
