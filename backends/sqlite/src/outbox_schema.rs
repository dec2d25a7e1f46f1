//! The outbox's table and its migrations, versioned like the records table (one row in
//! `dedup_schema_versions` per table, see [`crate::schema`]).

use rusqlite::Connection;

use crate::schema;
use dedup_core::Result;

/// Migration `n` (1-based) brings the outbox table from version `n - 1` to `n`. Never edit
/// a released migration: append a new one.
///
/// Times are milliseconds since the Unix epoch. `headers` is JSON text, an array of
/// `[name, value]` pairs in the order they were added. `id` is `AUTOINCREMENT`, so ids only
/// ever grow, even after the newest rows were purged.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: the outbox table; indexes for due rows, ordering keys and purge.
    "CREATE TABLE \"{table}\" (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        destination  TEXT    NOT NULL,
        message_id   TEXT    NOT NULL UNIQUE,
        headers      TEXT    NOT NULL,
        payload      BLOB    NOT NULL,
        ordering_key TEXT,
        written_at   INTEGER NOT NULL,
        due_at       INTEGER NOT NULL,
        attempts     INTEGER NOT NULL DEFAULT 0,
        state        TEXT    NOT NULL CHECK (state IN ('pending', 'held', 'sent', 'dead')),
        holder       TEXT,
        held_until   INTEGER,
        sent_at      INTEGER,
        last_error   TEXT
    );
    CREATE INDEX \"{table}_due_idx\" ON \"{table}\" (state, due_at);
    CREATE INDEX \"{table}_key_idx\" ON \"{table}\" (ordering_key, id)
        WHERE ordering_key IS NOT NULL;
    CREATE INDEX \"{table}_sent_idx\" ON \"{table}\" (sent_at) WHERE state = 'sent';",
];

/// The outbox table's schema version this build creates and understands.
pub(crate) const CURRENT_VERSION: i64 = MIGRATIONS.len() as i64;

/// Create or migrate the outbox table `table` (see [`schema::migrate`]).
pub(crate) fn migrate(conn: &mut Connection, table: &str) -> Result<()> {
    schema::migrate_table(conn, table, MIGRATIONS)
}

/// Check, writing nothing, that the outbox table `table` is at [`CURRENT_VERSION`] (see
/// [`schema::check`]).
pub(crate) fn check(conn: &Connection, table: &str) -> Result<()> {
    schema::check_table(conn, table, CURRENT_VERSION)
}

#[cfg(test)]
mod tests {
    use dedup_core::Error;

    use super::*;

    #[test]
    fn the_outbox_table_is_versioned_beside_the_records_table() {
        let mut conn = Connection::open_in_memory().unwrap();
        assert!(matches!(
            check(&conn, "o").unwrap_err(),
            Error::SchemaNotMigrated { found: 0, .. }
        ));
        schema::migrate(&mut conn, "t").unwrap();
        migrate(&mut conn, "o").unwrap();
        migrate(&mut conn, "o").unwrap();
        check(&conn, "o").unwrap();
        schema::check(&conn, "t").unwrap();
        conn.execute(
            "UPDATE dedup_schema_versions SET version = 9 WHERE table_name = 'o'",
            [],
        )
        .unwrap();
        assert!(matches!(
            migrate(&mut conn, "o").unwrap_err(),
            Error::SchemaTooNew { found: 9, .. }
        ));
        assert!(matches!(
            check(&conn, "o").unwrap_err(),
            Error::SchemaTooNew { .. }
        ));
    }
}
