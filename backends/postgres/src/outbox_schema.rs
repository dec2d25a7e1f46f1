//! The outbox's table and its migrations, versioned beside the records table's (one row
//! per table in `dedup_schema_versions`) and run by the same [`migrate`](crate::schema)
//! under the same advisory lock.

use dedup_core::Result;
use sqlx::PgConnection;

use crate::config::PostgresConfig;
use crate::ddl::{VERSIONS_TABLE, execute, record_version_of, recorded_version_of, render_table};
use crate::error::backend;

/// Migration `n` (1-based) brings the outbox table from version `n - 1` to `n`. Never edit
/// a released migration: append a new one. Placeholders as in the records table's
/// migrations (`{table}` is the outbox table here). The README shows them as
/// [`migrate_in`] runs them for the default config.
const MIGRATIONS: &[&str] = &[
    // 1: the outbox table; indexes for due rows, ordering keys and purge.
    r#"CREATE TABLE {table} (
    id           bigserial PRIMARY KEY,  -- increasing in insertion order
    destination  text    NOT NULL,
    message_id   text    NOT NULL UNIQUE,
    headers      jsonb   NOT NULL,       -- [[name, value], ...] in the order added
    payload      bytea   NOT NULL,
    ordering_key text,
    written_at   bigint  NOT NULL,       -- ms since the Unix epoch, as every time here
    due_at       bigint  NOT NULL,
    attempts     integer NOT NULL DEFAULT 0,
    state        text    NOT NULL CHECK (state IN ('pending', 'held', 'sent', 'dead')),
    holder       uuid,                   -- the relay's hold token while held
    held_until   bigint,
    sent_at      bigint,
    last_error   text
);
CREATE INDEX "{due_idx}" ON {table} (state, due_at);
CREATE INDEX "{key_idx}" ON {table} (ordering_key, id) WHERE ordering_key IS NOT NULL;
CREATE INDEX "{sent_idx}" ON {table} (sent_at) WHERE state = 'sent';
"#,
    // 2: the due index keeps only the rows a take looks at, in the take's order: a mark
    // no longer adds an entry for its sent row, and a take reads no more than it locks.
    r#"DROP INDEX "{schema}"."{due_idx}";
CREATE INDEX "{active_idx}" ON {table} (state, due_at, id) WHERE state IN ('pending', 'held');
"#,
];

/// The outbox table's schema version this build creates and understands.
pub(crate) const CURRENT_VERSION: i64 = MIGRATIONS.len() as i64;

/// Create or upgrade the outbox table inside `migrate`'s transaction (which holds the
/// schema's migration lock and created the versions table). A newer table is
/// [`Error::SchemaTooNew`](dedup_core::Error::SchemaTooNew); a table of that name the store did not create makes the
/// `CREATE TABLE` fail instead of being adopted.
pub(crate) async fn migrate_in(tx: &mut PgConnection, config: &PostgresConfig) -> Result<()> {
    let table = config.outbox_table_name();
    let found = recorded_version_of(tx, &config.schema, &table)
        .await?
        .unwrap_or(0);
    let pending = dedup_sql::migrate::pending(MIGRATIONS, found, &config.qualified_outbox_table())?;
    if pending.is_empty() {
        return Ok(());
    }
    for migration in pending {
        execute(tx, render_table(migration, &config.schema, &table)).await?;
    }
    record_version_of(tx, &config.schema, &table, CURRENT_VERSION).await
}

/// Check, writing nothing, that the outbox table is at [`CURRENT_VERSION`]: missing or
/// older is [`Error::SchemaNotMigrated`](dedup_core::Error::SchemaNotMigrated), newer [`Error::SchemaTooNew`](dedup_core::Error::SchemaTooNew).
pub(crate) async fn check(conn: &mut PgConnection, config: &PostgresConfig) -> Result<()> {
    let versions: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = $2)",
    )
    .bind(&config.schema)
    .bind(VERSIONS_TABLE)
    .fetch_one(&mut *conn)
    .await
    .map_err(backend)?;
    let found = match versions {
        true => recorded_version_of(conn, &config.schema, &config.outbox_table_name())
            .await?
            .unwrap_or(0),
        false => 0,
    };
    dedup_sql::migrate::expect_version(config.qualified_outbox_table(), found, CURRENT_VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readme_shows_the_outbox_schema() {
        let readme = include_str!("../README.md");
        let config = PostgresConfig::default();
        for (n, migration) in MIGRATIONS.iter().enumerate() {
            let ddl = render_table(migration, &config.schema, &config.outbox_table_name());
            assert!(
                readme.contains(&ddl),
                "README.md must show outbox migration {} exactly as migrate() runs it:\n{ddl}",
                n + 1
            );
            assert!(!ddl.contains(['{', '}']), "a placeholder left in:\n{ddl}");
        }
    }
}
