//! The outbox's tables and their migrations, versioned beside the records table's (one row
//! per table in `dedup_schema_versions`) and run by the records table's
//! [`migrate`](crate::schema) (its `after` hook), under the same named lock.
//!
//! As for the records table, MySQL commits DDL implicitly: every migration is idempotent
//! (`IF NOT EXISTS`) and the version row is written after the last one, so a migration
//! interrupted halfway runs again.

use dedup_core::{Error, Result};
use sqlx::{AssertSqlSafe, MySqlConnection};

use crate::config::{MySqlConfig, keys_table_name};
use crate::error::backend;
use crate::versions;

/// Migration `n` (1-based) brings the outbox tables from version `n - 1` to `n`. Never
/// edit a released migration: append a new one. `{table}` is the quoted outbox table,
/// `{keys}` the quoted table of its ordering keys (see [`keys_table_name`]). The README
/// shows them as [`migrate_in`] runs them for the default config.
const MIGRATIONS: &[&str] = &[
    // 1: the outbox table, its indexes for due rows, ordering keys and purge; the table
    // whose rows producers lock per ordering key.
    r#"CREATE TABLE IF NOT EXISTS {table} (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,  -- increasing in insertion order
    destination  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    message_id   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    headers      MEDIUMTEXT   CHARACTER SET utf8mb4 NOT NULL,  -- JSON: [[name, value], ...] in the order added
    payload      MEDIUMBLOB   NOT NULL,
    ordering_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    written_at   BIGINT       NOT NULL,  -- ms since the Unix epoch, as every time here
    due_at       BIGINT       NOT NULL,
    attempts     INT          NOT NULL DEFAULT 0,
    state        VARCHAR(7)   CHARACTER SET ascii NOT NULL,
    holder       CHAR(36)     CHARACTER SET ascii,  -- the relay's hold token while held
    held_until   BIGINT,
    sent_at      BIGINT,
    last_error   TEXT         CHARACTER SET utf8mb4,
    UNIQUE KEY message_id_idx (message_id),
    KEY due_idx (state, due_at),
    KEY key_idx (ordering_key, id),
    KEY sent_idx (state, sent_at),
    CHECK (state IN ('pending', 'held', 'sent', 'dead'))
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS {keys} (
    ordering_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY
) ENGINE = InnoDB"#,
];

/// The outbox tables' schema version this build creates and understands.
pub(crate) const CURRENT_VERSION: i64 = MIGRATIONS.len() as i64;

/// The columns of the version 1 outbox table besides the decoded ones
/// ([`ROW_COLUMNS`](dedup_sql::outbox::ROW_COLUMNS)): a table of the outbox's name without
/// them all is not the store's, and is refused rather than adopted.
const V1_HOLD_COLUMNS: [&str; 2] = ["holder", "held_until"];

/// `migration` for `config`'s outbox.
fn render(migration: &str, config: &MySqlConfig) -> String {
    let outbox = config.outbox_table_name();
    migration
        .replace("{table}", &format!("`{outbox}`"))
        .replace("{keys}", &format!("`{}`", keys_table_name(&outbox)))
}

/// Create or upgrade the outbox tables on `conn`, which holds the database's migration lock:
/// the records table's [`migrate`](crate::schema) runs this as its `after` hook, once the
/// versions table exists and the records table is current. A newer table is
/// [`Error::SchemaTooNew`](dedup_core::Error::SchemaTooNew); a table of the outbox's name that the store did not create is
/// refused, and nothing changes.
pub(crate) async fn migrate_in(conn: &mut MySqlConnection, config: &MySqlConfig) -> Result<()> {
    let table = config.outbox_table_name();
    let recorded = versions::recorded(conn, &table).await?;
    let found = match recorded {
        Some(version) => version,
        None => unrecorded_version(conn, &table).await?,
    };
    for migration in dedup_sql::migrate::pending(MIGRATIONS, found, &format!("`{table}`"))? {
        sqlx::raw_sql(AssertSqlSafe(render(migration, config)))
            .execute(&mut *conn)
            .await
            .map_err(backend)?;
    }
    if recorded != Some(CURRENT_VERSION) {
        versions::record(conn, &table, CURRENT_VERSION).await?;
    }
    Ok(())
}

/// Check, writing nothing, that the outbox tables are at [`CURRENT_VERSION`]: missing or
/// older is [`Error::SchemaNotMigrated`](dedup_core::Error::SchemaNotMigrated), newer [`Error::SchemaTooNew`](dedup_core::Error::SchemaTooNew).
pub(crate) async fn check(conn: &mut MySqlConnection, config: &MySqlConfig) -> Result<()> {
    let name = config.outbox_table_name();
    let found = match versions::exists(conn).await? {
        true => versions::recorded(conn, &name).await?.unwrap_or(0),
        false => 0,
    };
    dedup_sql::migrate::expect_version(format!("`{name}`"), found, CURRENT_VERSION)
}

/// The version of an outbox table without a recorded version: 0 when it does not exist or
/// has the version 1 columns (a migration interrupted before its version row: it runs
/// again, idempotent). A table that lacks them is someone else's: refused.
async fn unrecorded_version(conn: &mut MySqlConnection, table: &str) -> Result<i64> {
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(column_name AS CHAR) FROM information_schema.columns \
         WHERE table_schema = DATABASE() AND table_name = ?",
    )
    .bind(table)
    .fetch_all(&mut *conn)
    .await
    .map_err(backend)?;
    if let Some(missing) = dedup_sql::outbox::ROW_COLUMNS
        .iter()
        .chain(&V1_HOLD_COLUMNS)
        .find(|c| !columns.is_empty() && !columns.iter().any(|have| have.eq_ignore_ascii_case(c)))
    {
        return Err(Error::invalid(
            "outbox table",
            format!(
                "`{table}` exists but is not a dedup outbox (it has no column {missing}); \
                 configure another outbox table name"
            ),
        ));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readme_shows_the_outbox_schema() {
        let readme = include_str!("../README.md");
        for (n, migration) in MIGRATIONS.iter().enumerate() {
            let ddl = render(migration, &MySqlConfig::default());
            assert!(
                readme.contains(&ddl),
                "README.md must show outbox migration {} exactly as migrate() runs it:\n{ddl}",
                n + 1
            );
            assert!(!ddl.contains(['{', '}']), "a placeholder left in:\n{ddl}");
        }
    }

    #[test]
    fn a_config_names_every_table_its_store_creates() {
        assert_eq!(
            MySqlConfig::default().table_names(),
            [
                "dedup_inbox",
                "dedup_inbox_outbox",
                "dedup_inbox_outbox_keys"
            ]
        );
        let config = MySqlConfig::from(dedup_sql::SqlSettings {
            table: "billing".into(),
            outbox_table: Some("events".into()),
            ..Default::default()
        });
        assert_eq!(config.table_names(), ["billing", "events", "events_keys"]);
    }
}
