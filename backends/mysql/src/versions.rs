//! The versions table (`dedup_schema_versions`, one per database) that both tables'
//! migrations use: the records table's in [`crate::schema`], the outbox's in
//! `outbox_schema`. One row per table: its name and its schema version.

use dedup_core::Result;
use dedup_sql::SqlDb;
use sqlx::{MySql, MySqlConnection};

use crate::config::VERSIONS_TABLE;
use crate::error::backend;

/// The DDL of the versions table (idempotent).
pub(crate) const VERSIONS_DDL: &str = "CREATE TABLE IF NOT EXISTS dedup_schema_versions (\n    \
     table_name VARCHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY,\n    \
     version    INT NOT NULL\n) ENGINE = InnoDB";

/// Whether the versions table exists in the connection's database.
pub(crate) async fn exists(conn: &mut MySqlConnection) -> Result<bool> {
    let found: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(1 AS SIGNED) FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name = ?",
    )
    .bind(VERSIONS_TABLE)
    .fetch_optional(&mut *conn)
    .await
    .map_err(backend)?;
    Ok(found.is_some())
}

/// The version recorded for `table`, if any.
pub(crate) async fn recorded(conn: &mut MySqlConnection, table: &str) -> Result<Option<i64>> {
    let read = "SELECT version FROM dedup_schema_versions WHERE table_name = ?";
    MySql::read_version(conn, read.to_owned(), table)
        .await
        .map_err(backend)
}

/// Record `version` as `table`'s.
pub(crate) async fn record(conn: &mut MySqlConnection, table: &str, version: i64) -> Result<()> {
    let write = "INSERT INTO dedup_schema_versions (table_name, version) VALUES (?, ?) \
                 ON DUPLICATE KEY UPDATE version = VALUES(version)";
    MySql::write_version(conn, write.to_owned(), table, version)
        .await
        .map_err(backend)
}
