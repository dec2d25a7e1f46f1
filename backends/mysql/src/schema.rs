//! The schema: one table and one index for purge, as an append-only list of versioned
//! migrations applied in order under a named lock per database, each table's version
//! recorded beside it in `dedup_schema_versions`. The runner and the version decision are
//! [`dedup_sql::migrate`]'s; this file supplies MySQL's lock, versions table and DDL. The
//! outbox's tables (`outbox_schema`) migrate in the same run, under the same lock.
//!
//! MySQL commits DDL implicitly (it cannot be rolled back), so the migrations are not one
//! transaction as on PostgreSQL: each is idempotent (`IF NOT EXISTS`), and the version row
//! is written after the last one, so a migration interrupted halfway runs again.

use async_trait::async_trait;
use dedup_core::{Error, Result};
use dedup_sql::migrate::Migrations;
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, MySql, MySqlConnection, MySqlPool};

use crate::config::MySqlConfig;
use crate::error::backend;
use crate::versions::{self, VERSIONS_DDL};

/// Migration `n` (1-based) brings a table from version `n - 1` to `n`; a missing table is
/// created by running them all, in order. Never edit a released migration: a new layout is
/// one more entry at the end. The README shows them as
/// [`MySqlStore::migrate`](crate::MySqlStore::migrate) runs them for the default config.
/// `{table}` is the quoted table name, `{table_name}` the bare one.
const MIGRATIONS: &[&str] = &[
    // 1: the records table, keyed by the key's bytes, and the purge index on `claimed_at`.
    r#"CREATE TABLE IF NOT EXISTS {table} (
    consumer     VARBINARY(200) NOT NULL,  -- the key, compared byte for byte
    message_id   VARBINARY(255) NOT NULL,
    token        CHAR(36) CHARACTER SET ascii,  -- the lease's token; once completed, the committing token
    fence        BIGINT     NOT NULL,      -- +1 each time the key changes hands
    attempt      BIGINT     NOT NULL,
    claimed_at   BIGINT     NOT NULL,      -- ms since the Unix epoch, set by claims only
    expires_at   BIGINT,                   -- ms since the Unix epoch; in flight only
    processed_at BIGINT,                   -- ms since the Unix epoch; NULL while in flight
    outcome      MEDIUMBLOB,
    fingerprint  VARBINARY(512),
    first_claimed_at BIGINT,              -- ms since the Unix epoch: the claim that created the row
    PRIMARY KEY (consumer, message_id),
    KEY claimed_idx (claimed_at),
    CHECK (processed_at IS NOT NULL OR (token IS NOT NULL AND expires_at IS NOT NULL))
) ENGINE = InnoDB"#,
    // 2: the latest released failure's cause (`Record::last_failure`: the encoded
    // `dedup_core::Failure`, at most 4 KiB), written by `release_failed` only; NULL for
    // older rows.
    r#"ALTER TABLE {table} ADD COLUMN last_failure BLOB"#,
    // 3: the last purge run of each records table in the database (`Admin::last_purge`),
    // one row per table, replaced by every purge that finishes; a table created anew starts
    // without one (a row left by a dropped table of that name is removed).
    r#"CREATE TABLE IF NOT EXISTS dedup_purge_runs (
    table_name    VARCHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY,  -- a records table
    finished_at   BIGINT  NOT NULL,  -- ms since the Unix epoch, by the store's clock
    removed       BIGINT  NOT NULL,
    took_ms       BIGINT  NOT NULL,
    stopped_early BOOLEAN NOT NULL
) ENGINE = InnoDB;
DELETE FROM dedup_purge_runs WHERE table_name = '{table_name}'"#,
];

/// `migration` for `config`'s table: `{table}` the quoted table, `{table_name}` its bare
/// name (validated: letters, digits and `_`, so safe inside a string literal).
fn render(migration: &str, config: &MySqlConfig) -> String {
    migration
        .replace("{table}", &config.quoted_table())
        .replace("{table_name}", &config.table)
}

/// Seconds a migrator waits for another node's migration of the same database.
const LOCK_WAIT_SECONDS: i64 = 60;

/// The migration lock's name: per database (`GET_LOCK` names are server-wide).
async fn lock_name(conn: &mut MySqlConnection) -> Result<String> {
    let database: Option<String> = sqlx::query_scalar("SELECT DATABASE()")
        .fetch_one(&mut *conn)
        .await
        .map_err(backend)?;
    let database = database.ok_or_else(|| {
        Error::invalid(
            "url",
            "the connection has no database: name one in the URL (mysql://host/DATABASE)",
        )
    })?;
    // GET_LOCK names are at most 64 characters.
    let name = format!("dedup-mysql migrate {database}");
    Ok(name.chars().take(64).collect())
}

/// The records table's migrations on MySQL / MariaDB (run by [`dedup_sql::store::migrate`]
/// and [`dedup_sql::store::check`]): the table (then the outbox's) created or upgraded under
/// a named lock per database (`GET_LOCK`), so concurrent migrators take turns; a table
/// without a version row is adopted as version 1 when it has the columns.
pub struct Inbox<'a> {
    pool: &'a MySqlPool,
    config: &'a MySqlConfig,
}

impl<'a> Inbox<'a> {
    /// The migrations of `config`'s table (validated) over `pool`.
    pub(crate) fn new(pool: &'a MySqlPool, config: &'a MySqlConfig) -> Self {
        Inbox { pool, config }
    }
}

/// A connection holding the named migration lock.
pub struct Locked {
    conn: PoolConnection<MySql>,
    name: String,
}

impl std::ops::Deref for Locked {
    type Target = MySqlConnection;
    fn deref(&self) -> &MySqlConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for Locked {
    fn deref_mut(&mut self) -> &mut MySqlConnection {
        &mut self.conn
    }
}

#[async_trait]
impl Migrations for Inbox<'_> {
    type Db = MySql;
    type Locked = Locked;
    const CASE_INSENSITIVE_COLUMNS: bool = true;

    fn table(&self) -> String {
        self.config.quoted_table()
    }

    fn migrations(&self) -> &'static [&'static str] {
        MIGRATIONS
    }

    fn render(&self, migration: &str) -> String {
        render(migration, self.config)
    }

    /// The version 1 layout's columns beyond the shared ones.
    fn more_required_columns(&self) -> &'static [&'static str] {
        &["claimed_at", "first_claimed_at"]
    }

    fn adopted_version(&self, _columns: &[String]) -> i64 {
        1
    }

    async fn lock(&self) -> Result<Locked> {
        let mut conn = self.pool.acquire().await.map_err(backend)?;
        let name = lock_name(&mut conn).await?;
        let got: Option<i64> = sqlx::query_scalar("SELECT CAST(GET_LOCK(?, ?) AS SIGNED)")
            .bind(&name)
            .bind(LOCK_WAIT_SECONDS)
            .fetch_one(&mut *conn)
            .await
            .map_err(backend)?;
        if got != Some(1) {
            return Err(Error::backend(
                crate::error::BACKEND,
                true,
                format!("another node held the migration lock {name:?} for {LOCK_WAIT_SECONDS} s"),
            ));
        }
        Ok(Locked { conn, name })
    }

    async fn prepare(&self, conn: &mut MySqlConnection) -> Result<()> {
        sqlx::raw_sql(VERSIONS_DDL)
            .execute(&mut *conn)
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn recorded_version(&self, conn: &mut MySqlConnection) -> Result<Option<i64>> {
        versions::recorded(conn, &self.config.table).await
    }

    async fn readable_version(&self, conn: &mut MySqlConnection) -> Result<Option<i64>> {
        Ok(match versions::exists(conn).await? {
            // A role that may not read it is told by the columns instead.
            true => self.recorded_version(conn).await.ok().flatten(),
            false => None,
        })
    }

    async fn columns(&self, conn: &mut MySqlConnection) -> Result<Vec<String>> {
        sqlx::query_scalar(
            "SELECT CAST(column_name AS CHAR) FROM information_schema.columns \
             WHERE table_schema = DATABASE() AND table_name = ?",
        )
        .bind(&self.config.table)
        .fetch_all(&mut *conn)
        .await
        .map_err(backend)
    }

    async fn apply(&self, conn: &mut MySqlConnection, ddl: String) -> Result<()> {
        match sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut *conn).await {
            Ok(_) => Ok(()),
            // An ADD COLUMN that an interrupted earlier run applied (SQLSTATE 42S21,
            // duplicate column name): done, as `IF NOT EXISTS` would say on MariaDB.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42S21") => Ok(()),
            Err(e) => Err(backend(e)),
        }
    }

    async fn record_version(&self, conn: &mut MySqlConnection, version: i64) -> Result<()> {
        versions::record(conn, &self.config.table, version).await
    }

    /// One entry point for both tables: the outbox's, under the same lock.
    async fn after(&self, conn: &mut MySqlConnection) -> Result<()> {
        crate::outbox_schema::migrate_in(conn, self.config).await
    }

    async fn unlock(&self, mut locked: Locked, result: Result<()>) -> Result<()> {
        let released = sqlx::query("DO RELEASE_LOCK(?)")
            .bind(&locked.name)
            .execute(&mut *locked.conn)
            .await
            .map_err(backend);
        result.and(released.map(drop))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readme_shows_the_schema() {
        let readme = include_str!("../README.md");
        let config = MySqlConfig::default();
        let unshown = dedup_sql::migrate::unshown(readme, MIGRATIONS, |m| render(m, &config));
        assert!(
            unshown.is_empty(),
            "README.md must show every migration exactly as migrate() runs it:\n{}",
            unshown.join("\n")
        );
        assert!(
            readme.contains(VERSIONS_DDL),
            "README.md must show the versions table"
        );
    }
}
