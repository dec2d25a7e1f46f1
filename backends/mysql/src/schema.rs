//! The schema: one table and one index for purge, as an append-only list of versioned
//! migrations applied in order under a named lock per database, each table's version
//! recorded beside it in `dedup_schema_versions`.
//!
//! MySQL commits DDL implicitly (it cannot be rolled back), so the migrations are not one
//! transaction as on PostgreSQL: each is idempotent (`IF NOT EXISTS`), and the version row
//! is written after the last one, so a migration interrupted halfway runs again.

use dedup_core::{Error, Result};
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, MySql, MySqlConnection, MySqlPool};

use crate::config::MySqlConfig;
use crate::error::backend;

/// Migration `n` (1-based) brings a table from version `n - 1` to `n`; a missing table is
/// created by running them all, in order. Never edit a released migration: a new layout is
/// one more entry at the end. The README shows them as [`migrate`] runs them for the default
/// config. `{table}` is the quoted table name.
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
];

/// The schema version this build creates and understands: the number of [`MIGRATIONS`].
pub(crate) const CURRENT_VERSION: i64 = MIGRATIONS.len() as i64;

/// `migration` for `config`'s table.
fn render(migration: &str, config: &MySqlConfig) -> String {
    migration.replace("{table}", &config.quoted_table())
}

pub(crate) use crate::config::VERSIONS_TABLE;

/// The DDL of the versions table (idempotent).
const VERSIONS_DDL: &str = "CREATE TABLE IF NOT EXISTS dedup_schema_versions (\n    \
     table_name VARCHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY,\n    \
     version    INT NOT NULL\n) ENGINE = InnoDB";

/// Seconds a migrator waits for another node's migration of the same database.
const LOCK_WAIT_SECONDS: i64 = 60;

/// Create or upgrade the store's table under a named lock per database (`GET_LOCK`), so
/// concurrent migrators take turns. The [`MIGRATIONS`] after the table's recorded version
/// run in order; a table without a version row is adopted as version 1 when it has the
/// columns; a newer one is refused with [`Error::SchemaTooNew`] and nothing changes.
pub(crate) async fn migrate(pool: &MySqlPool, config: &MySqlConfig) -> Result<()> {
    config.validate()?;
    let mut conn = pool.acquire().await.map_err(backend)?;
    let lock = lock(&mut conn).await?;
    let result = migrate_locked(&mut conn, config).await;
    result.and(unlock(&mut conn, &lock).await)
}

/// Take the database's migration lock on `conn` (waiting up to [`LOCK_WAIT_SECONDS`] for
/// another node's migration); returns its name for [`unlock`].
pub(crate) async fn lock(conn: &mut PoolConnection<MySql>) -> Result<String> {
    let lock = lock_name(conn).await?;
    let got: Option<i64> = sqlx::query_scalar("SELECT CAST(GET_LOCK(?, ?) AS SIGNED)")
        .bind(&lock)
        .bind(LOCK_WAIT_SECONDS)
        .fetch_one(&mut **conn)
        .await
        .map_err(backend)?;
    if got != Some(1) {
        return Err(Error::backend(
            crate::error::BACKEND,
            true,
            format!("another node held the migration lock {lock:?} for {LOCK_WAIT_SECONDS} s"),
        ));
    }
    Ok(lock)
}

/// Release the migration lock [`lock`] took.
pub(crate) async fn unlock(conn: &mut PoolConnection<MySql>, lock: &str) -> Result<()> {
    sqlx::query("DO RELEASE_LOCK(?)")
        .bind(lock)
        .execute(&mut **conn)
        .await
        .map_err(backend)?;
    Ok(())
}

async fn migrate_locked(conn: &mut MySqlConnection, config: &MySqlConfig) -> Result<()> {
    execute(conn, VERSIONS_DDL.to_owned()).await?;
    let recorded = recorded_version(conn, config).await?;
    let found = match recorded {
        Some(version) => version,
        None => unrecorded_version(conn, config).await?,
    };
    let pending = usize::try_from(found)
        .ok()
        .and_then(|done| MIGRATIONS.get(done..))
        .ok_or_else(|| Error::SchemaTooNew {
            table: config.quoted_table(),
            found,
            known: CURRENT_VERSION,
        })?;
    for migration in pending {
        match sqlx::raw_sql(AssertSqlSafe(render(migration, config)))
            .execute(&mut *conn)
            .await
        {
            Ok(_) => {}
            // An ADD COLUMN that an interrupted earlier run applied (SQLSTATE 42S21,
            // duplicate column name): done, as `IF NOT EXISTS` would say on MariaDB.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42S21") => {}
            Err(e) => return Err(backend(e)),
        }
    }
    if recorded != Some(CURRENT_VERSION) {
        sqlx::query(
            "INSERT INTO dedup_schema_versions (table_name, version) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE version = VALUES(version)",
        )
        .bind(&config.table)
        .bind(i32::try_from(CURRENT_VERSION).unwrap_or(i32::MAX))
        .execute(&mut *conn)
        .await
        .map_err(backend)?;
    }
    Ok(())
}

/// The migration lock's name: per database (`GET_LOCK` names are server-wide).
async fn lock_name(conn: &mut PoolConnection<MySql>) -> Result<String> {
    let database: Option<String> = sqlx::query_scalar("SELECT DATABASE()")
        .fetch_one(&mut **conn)
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

/// Check, writing nothing, that the store's table is at [`CURRENT_VERSION`]: for stores
/// opened without migrating. A missing or older table is [`Error::SchemaNotMigrated`], a
/// newer one [`Error::SchemaTooNew`].
pub(crate) async fn check(pool: &MySqlPool, config: &MySqlConfig) -> Result<()> {
    let mut conn = pool.acquire().await.map_err(backend)?;
    let versions_exist: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(1 AS SIGNED) FROM information_schema.tables WHERE table_schema = DATABASE() \
         AND table_name = ?",
    )
    .bind(VERSIONS_TABLE)
    .fetch_optional(&mut *conn)
    .await
    .map_err(backend)?;
    let recorded = match versions_exist {
        // A role that may not read it is told by the columns instead.
        Some(_) => recorded_version(&mut conn, config).await.ok().flatten(),
        None => None,
    };
    let found = match recorded {
        Some(version) => version,
        None => unrecorded_version(&mut conn, config).await?,
    };
    match found.cmp(&CURRENT_VERSION) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Less => Err(Error::SchemaNotMigrated {
            table: config.quoted_table(),
            found,
            expected: CURRENT_VERSION,
        }),
        std::cmp::Ordering::Greater => Err(Error::SchemaTooNew {
            table: config.quoted_table(),
            found,
            known: CURRENT_VERSION,
        }),
    }
}

/// Run DDL whose names were validated (ASCII letters, digits, '_'), so safe to splice.
pub(crate) async fn execute(conn: &mut MySqlConnection, ddl: String) -> Result<()> {
    sqlx::raw_sql(AssertSqlSafe(ddl))
        .execute(&mut *conn)
        .await
        .map_err(backend)?;
    Ok(())
}

/// The version recorded for the store's table, if any.
async fn recorded_version(conn: &mut MySqlConnection, config: &MySqlConfig) -> Result<Option<i64>> {
    let version: Option<i32> =
        sqlx::query_scalar("SELECT version FROM dedup_schema_versions WHERE table_name = ?")
            .bind(&config.table)
            .fetch_optional(&mut *conn)
            .await
            .map_err(backend)?;
    Ok(version.map(i64::from))
}

/// The columns of the version 1 layout.
const V1_COLUMNS: [&str; 11] = [
    "consumer",
    "message_id",
    "token",
    "fence",
    "attempt",
    "claimed_at",
    "expires_at",
    "processed_at",
    "outcome",
    "fingerprint",
    "first_claimed_at",
];

/// The version of a table without a recorded version: 0 when it does not exist, 1 when it
/// has the columns. A table that lacks them is someone else's: refused, and nothing is
/// changed.
async fn unrecorded_version(conn: &mut MySqlConnection, config: &MySqlConfig) -> Result<i64> {
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(column_name AS CHAR) FROM information_schema.columns \
         WHERE table_schema = DATABASE() AND table_name = ?",
    )
    .bind(&config.table)
    .fetch_all(&mut *conn)
    .await
    .map_err(backend)?;
    if columns.is_empty() {
        return Ok(0);
    }
    if let Some(missing) = V1_COLUMNS
        .iter()
        .find(|c| !columns.iter().any(|have| have.eq_ignore_ascii_case(c)))
    {
        return Err(Error::invalid(
            "table",
            format!(
                "{} exists but is not a dedup table (it has no column {missing}); configure \
                 another table name",
                config.quoted_table()
            ),
        ));
    }
    Ok(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readme_shows_the_schema() {
        let readme = include_str!("../README.md");
        for (n, migration) in MIGRATIONS.iter().enumerate() {
            let ddl = render(migration, &MySqlConfig::default());
            assert!(
                readme.contains(&ddl),
                "README.md must show migration {} exactly as migrate() runs it:\n{ddl}",
                n + 1
            );
        }
        assert!(
            readme.contains(VERSIONS_DDL),
            "README.md must show the versions table"
        );
    }
}
