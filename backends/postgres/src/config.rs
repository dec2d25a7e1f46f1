//! [`PostgresConfig`]: where the records live and which clock leases use.

use std::ops::{Deref, DerefMut};

use dedup_core::backend::names::sql_identifier;
use dedup_core::{Error, MAX_BATCH_LEN, Result};
use dedup_sql::config::{SqlConfig, SqlSettings};
use dedup_sql::target::TargetConfig;

use crate::ring::Partitions;

/// How a [`PostgresStore`](crate::PostgresStore) is set up: the [`SqlSettings`] every sqlx
/// store shares, in [`sql`](Self::sql), and PostgreSQL's own.
///
/// Build it with struct-update syntax so new fields keep your code compiling. The shared
/// settings read through `Deref`: `config.table` is `config.sql.table`.
///
/// ```
/// use dedup_postgres::{PostgresConfig, SqlSettings};
/// let config = PostgresConfig {
///     schema: "billing".into(),
///     sql: SqlSettings { table: "billing_inbox".into(), ..Default::default() },
///     ..Default::default()
/// };
/// assert_eq!((config.schema.as_str(), config.table.as_str()), ("billing", "billing_inbox"));
/// ```
#[derive(Clone, Debug)]
pub struct PostgresConfig {
    /// The schema holding the tables (created by [`migrate`](crate::PostgresStore::migrate)
    /// when missing). Default `public`. ASCII letters, digits and `_`, at most 63 bytes.
    pub schema: String,
    /// The settings every sqlx store shares: the records and outbox tables (in
    /// [`schema`](Self::schema)), the clock (default: the server's `clock_timestamp()`),
    /// the pool, the timeouts, TLS, migrating. See the crate docs on sizing the pool.
    pub sql: SqlSettings,
    /// Group commit of single claims and single commits: concurrent
    /// [`claim`](dedup_core::DedupStore::claim) calls on this store share one statement
    /// (and one transaction, so one flush of the server's log) per round, and so do
    /// concurrent [`commit`](dedup_core::DedupStore::commit) calls; each caller gets its own
    /// result, as if it had run alone, once the statement holding its request committed. A
    /// lone caller runs at once, on its own statement. Default: on
    /// ([`GroupCommit::default`]); `None` runs every call on its own statement.
    pub group_commit: Option<GroupCommit>,
    /// The partitioned layout (opt-in): the records table as a ring of time partitions,
    /// which a purge truncates whole instead of deleting rows one by one. See
    /// [`Partitions`] for what it guarantees and costs. Chosen when the table is created.
    /// Default `None`: one plain table.
    pub partitions: Option<Partitions>,
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
            sql: SqlSettings::default(),
            group_commit: Some(GroupCommit::default()),
            partitions: None,
        }
    }
}

impl PostgresConfig {
    /// Check the schema and the shared settings ([`SqlSettings::validate`]: table names,
    /// timeouts, TLS files), the group commit bounds and the partitions.
    pub fn validate(&self) -> Result<()> {
        sql_identifier("schema", &self.schema)?;
        self.validate_settings()?;
        if let Some(group) = &self.group_commit {
            group.validate()?;
        }
        match &self.partitions {
            Some(partitions) => partitions.validate(),
            None => Ok(()),
        }
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

impl From<SqlSettings> for PostgresConfig {
    /// The configuration with these shared settings, PostgreSQL's own at their defaults.
    fn from(sql: SqlSettings) -> Self {
        PostgresConfig {
            sql,
            ..PostgresConfig::default()
        }
    }
}

impl Deref for PostgresConfig {
    type Target = SqlSettings;

    fn deref(&self) -> &SqlSettings {
        &self.sql
    }
}

impl DerefMut for PostgresConfig {
    fn deref_mut(&mut self) -> &mut SqlSettings {
        &mut self.sql
    }
}

impl SqlConfig for PostgresConfig {
    const VERSIONS_TABLE: &'static str = crate::ddl::VERSIONS_TABLE;
}

impl TargetConfig for PostgresConfig {
    fn location(&self) -> String {
        format!("table {}.{}", self.schema, self.table)
    }

    fn check(&self) -> Result<()> {
        self.validate()
    }
}
