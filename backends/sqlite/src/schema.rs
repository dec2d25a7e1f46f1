//! The store's schema and its migrations, versioned per table.
//!
//! `PRAGMA user_version` is one number per database *file*, and the transactional API is
//! meant for a file the application shares with its own tables (and maybe its own
//! migrations using `user_version`). So the version is kept per dedup table, in a small
//! table of its own: `dedup_schema_versions(table_name, version)`. Several dedup tables
//! can live in one file, each migrated on its own.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use crate::config::SCHEMA_VERSIONS_TABLE;
use crate::error::backend;
use dedup_core::{Error, Result};

/// Migration `n` (1-based) brings a table from version `n - 1` to `n`. Never edit a
/// released migration: append a new one.
const MIGRATIONS: &[&str] = &[
    // 1: the records table and the indexes purge scans.
    "CREATE TABLE \"{table}\" (
        consumer     TEXT    NOT NULL,
        message_id   TEXT    NOT NULL,
        state        TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed')),
        token        TEXT,
        fence        INTEGER NOT NULL,
        attempt      INTEGER NOT NULL,
        expires_at   INTEGER,
        processed_at INTEGER,
        outcome      BLOB,
        fingerprint  TEXT,
        PRIMARY KEY (consumer, message_id)
    );
    CREATE INDEX \"{table}_purge_completed\" ON \"{table}\" (state, processed_at);
    CREATE INDEX \"{table}_purge_expired\" ON \"{table}\" (state, expires_at);",
    // 2: one purge index instead of two. A completed record has `processed_at` and no
    // `expires_at`, an in-flight one the reverse, so `coalesce(processed_at, expires_at)`
    // is the instant a purge compares with its cutoff. Every claim and commit now writes
    // one index entry instead of two (commits changed `state`, a column of both).
    "CREATE INDEX \"{table}_purge_idx\" ON \"{table}\" (coalesce(processed_at, expires_at));
    DROP INDEX \"{table}_purge_completed\";
    DROP INDEX \"{table}_purge_expired\";",
    // 3: when the key was first claimed (`Record::first_claimed_at`), kept through
    // takeovers; NULL for records written before this version.
    "ALTER TABLE \"{table}\" ADD COLUMN first_claimed_at INTEGER;",
    // 4: the latest released failure's cause (`Record::last_failure`, the encoded
    // `dedup_core::Failure`, at most 4 KiB); NULL for records written before this version.
    "ALTER TABLE \"{table}\" ADD COLUMN last_failure BLOB;",
    // 5: the last purge run of each records table in the file (`Admin::last_purge`), one
    // row per table, replaced by every purge that finishes; a table created anew starts
    // without one (a row left by a dropped table of that name is removed).
    "CREATE TABLE IF NOT EXISTS dedup_purge_runs (
        table_name    TEXT    PRIMARY KEY NOT NULL,
        finished_at   INTEGER NOT NULL,
        removed       INTEGER NOT NULL,
        took_ms       INTEGER NOT NULL,
        stopped_early INTEGER NOT NULL
    );
    DELETE FROM dedup_purge_runs WHERE table_name = '{table}';",
];

/// The schema version this build creates and understands.
pub(crate) const CURRENT_VERSION: i64 = MIGRATIONS.len() as i64;

const CREATE_VERSIONS: &str = "CREATE TABLE IF NOT EXISTS \"{versions}\" (
    table_name TEXT PRIMARY KEY NOT NULL,
    version    INTEGER NOT NULL
)";
const SELECT_VERSION: &str = "SELECT version FROM \"{versions}\" WHERE table_name = ?1";
const SET_VERSION: &str = "INSERT INTO \"{versions}\" (table_name, version) VALUES (?1, ?2) \
     ON CONFLICT (table_name) DO UPDATE SET version = excluded.version";

fn versions_sql(template: &str) -> String {
    template.replace("{versions}", SCHEMA_VERSIONS_TABLE)
}

/// Create or migrate `table` to [`CURRENT_VERSION`], in one immediate transaction (so
/// processes opening the same file at once migrate it exactly once).
///
/// A table of that name that the store did not create makes version 1's `CREATE TABLE` fail
/// instead of being silently adopted. A table at a newer version than this build knows is
/// an error.
pub(crate) fn migrate(conn: &mut Connection, table: &str) -> Result<()> {
    migrate_table(conn, table, MIGRATIONS)
}

/// [`migrate`] for any of the store's tables: `migrations` is that table's list (migration
/// `n` brings it from version `n - 1` to `n`), versioned in the same versions table.
pub(crate) fn migrate_table(conn: &mut Connection, table: &str, migrations: &[&str]) -> Result<()> {
    let current = migrations.len() as i64;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(backend)?;
    tx.execute(&versions_sql(CREATE_VERSIONS), [])
        .map_err(backend)?;
    let found: i64 = tx
        .query_row(&versions_sql(SELECT_VERSION), [table], |row| row.get(0))
        .optional()
        .map_err(backend)?
        .unwrap_or(0);
    if found > current {
        return Err(Error::SchemaTooNew {
            table: table.to_owned(),
            found,
            known: current,
        });
    }
    if found == current {
        return Ok(()); // dropping tx rolls back the (empty) transaction
    }
    for migration in &migrations[found as usize..] {
        tx.execute_batch(&migration.replace("{table}", table))
            .map_err(backend)?;
    }
    tx.execute(
        &versions_sql(SET_VERSION),
        rusqlite::params![table, current],
    )
    .map_err(backend)?;
    tx.commit().map_err(backend)
}

/// Check, writing nothing, that `table` is at [`CURRENT_VERSION`]: for stores opened
/// without migrating. A missing or older table is [`Error::SchemaNotMigrated`], a newer one
/// [`Error::SchemaTooNew`].
pub(crate) fn check(conn: &Connection, table: &str) -> Result<()> {
    check_table(conn, table, CURRENT_VERSION)
}

/// [`check`] for any of the store's tables, expected at version `current`.
pub(crate) fn check_table(conn: &Connection, table: &str, current: i64) -> Result<()> {
    let versions: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
            [SCHEMA_VERSIONS_TABLE],
            |row| row.get(0),
        )
        .map_err(backend)?;
    let found: i64 = match versions {
        false => 0,
        true => conn
            .query_row(&versions_sql(SELECT_VERSION), [table], |row| row.get(0))
            .optional()
            .map_err(backend)?
            .unwrap_or(0),
    };
    match found.cmp(&current) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Less => Err(Error::SchemaNotMigrated {
            table: table.to_owned(),
            found,
            expected: current,
        }),
        std::cmp::Ordering::Greater => Err(Error::SchemaTooNew {
            table: table.to_owned(),
            found,
            known: current,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_writes_nothing_and_names_dedup_migrate() {
        let mut conn = Connection::open_in_memory().unwrap();
        let missing = check(&conn, "t").unwrap_err();
        assert!(
            matches!(missing, Error::SchemaNotMigrated { found: 0, .. }),
            "{missing:?}"
        );
        assert!(missing.to_string().contains("dedup migrate"), "{missing}");
        let tables: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .unwrap();
        assert_eq!(tables, 0, "a check creates nothing");
        migrate(&mut conn, "t").unwrap();
        check(&conn, "t").unwrap();
        conn.execute(&versions_sql(SET_VERSION), rusqlite::params!["t", 1])
            .unwrap();
        assert!(matches!(
            check(&conn, "t").unwrap_err(),
            Error::SchemaNotMigrated {
                found: 1,
                expected: CURRENT_VERSION,
                ..
            }
        ));
        conn.execute(
            &versions_sql(SET_VERSION),
            rusqlite::params!["t", CURRENT_VERSION + 1],
        )
        .unwrap();
        assert!(matches!(
            check(&conn, "t").unwrap_err(),
            Error::SchemaTooNew { .. }
        ));
    }

    #[test]
    fn migrating_twice_is_a_no_op_and_tables_are_versioned_separately() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn, "a").unwrap();
        migrate(&mut conn, "a").unwrap();
        migrate(&mut conn, "b").unwrap();
        let versions: Vec<(String, i64)> = conn
            .prepare("SELECT table_name, version FROM dedup_schema_versions ORDER BY 1")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(
            versions,
            vec![("a".into(), CURRENT_VERSION), ("b".into(), CURRENT_VERSION)]
        );
        let user_version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(user_version, 0, "user_version belongs to the application");
    }

    #[test]
    fn a_foreign_table_of_that_name_is_not_adopted() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute("CREATE TABLE mine (x INTEGER)", []).unwrap();
        let err = migrate(&mut conn, "mine").unwrap_err();
        assert!(!err.is_retryable(), "{err:?}");
        let count: i64 = conn
            .query_row("SELECT count(*) FROM dedup_schema_versions", [], |r| {
                r.get(0)
            })
            .unwrap_or(0);
        assert_eq!(count, 0, "the failed migration left no version behind");
    }

    #[test]
    fn a_version_1_table_is_upgraded_in_place_with_its_records() {
        let mut conn = Connection::open_in_memory().unwrap();
        // Version 1 as the first release left it, with a completed and an in-flight record.
        conn.execute_batch(&versions_sql(CREATE_VERSIONS)).unwrap();
        conn.execute_batch(&MIGRATIONS[0].replace("{table}", "t"))
            .unwrap();
        conn.execute(&versions_sql(SET_VERSION), rusqlite::params!["t", 1])
            .unwrap();
        conn.execute_batch(
            "INSERT INTO t VALUES ('c', 'done', 'completed', 'x', 1, 1, NULL, 100, NULL, NULL);
             INSERT INTO t VALUES ('c', 'busy', 'in_flight', 'y', 1, 1, 200, NULL, NULL, NULL);",
        )
        .unwrap();

        migrate(&mut conn, "t").unwrap();
        let indexes: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 't' AND sql IS NOT NULL")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(indexes, vec!["t_purge_idx".to_owned()]);
        let version: i64 = conn
            .query_row(&versions_sql(SELECT_VERSION), ["t"], |r| r.get(0))
            .unwrap();
        assert_eq!(version, CURRENT_VERSION);
        // Version 3's column: unknown for records written before it.
        let unknown: i64 = conn
            .query_row(
                "SELECT count(*) FROM t WHERE first_claimed_at IS NULL",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(unknown, 2);
        // Both records are found by the new index: a purge at 300 with cutoff 250.
        let q = crate::statements::Statements::new("t");
        let purged: Vec<String> = conn
            .prepare(&q.purge_batch)
            .unwrap()
            .query_map(rusqlite::params![250, 300, 10], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(purged.len(), 2, "{purged:?}");
        // Version 5's table: no run kept for the table yet.
        let runs: i64 = conn
            .query_row(
                "SELECT count(*) FROM dedup_purge_runs WHERE table_name = 't'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(runs, 0);
    }

    #[test]
    fn a_table_created_anew_drops_the_purge_run_of_an_earlier_table_of_its_name() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn, "t").unwrap();
        conn.execute("INSERT INTO dedup_purge_runs VALUES ('t', 1, 2, 3, 0)", [])
            .unwrap();
        conn.execute_batch(
            "DROP TABLE t; DELETE FROM dedup_schema_versions WHERE table_name = 't';",
        )
        .unwrap();
        migrate(&mut conn, "t").unwrap();
        let runs: i64 = conn
            .query_row("SELECT count(*) FROM dedup_purge_runs", [], |r| r.get(0))
            .unwrap();
        assert_eq!(runs, 0, "the new table starts without the old one's run");
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn, "t").unwrap();
        conn.execute(
            "UPDATE dedup_schema_versions SET version = 99 WHERE table_name = 't'",
            [],
        )
        .unwrap();
        let err = migrate(&mut conn, "t").unwrap_err();
        assert!(
            matches!(
                &err,
                Error::SchemaTooNew { table, found: 99, known: CURRENT_VERSION } if table == "t"
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("schema version 99"), "{err}");
    }
}
