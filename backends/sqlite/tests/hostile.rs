//! Hostile input specific to SQLite: a table with the store's name but a schema of someone
//! else's. Opening (or any later call) is a typed error, never a panic, and the foreign
//! table and its rows are left as they were.

use dedup_sqlite::rusqlite::Connection;
use dedup_sqlite::{SqliteConfig, SqliteStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_table_with_an_unexpected_schema_is_a_typed_error_and_left_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("foreign.db");
    let table = SqliteConfig::default().table;
    let conn = Connection::open(&path).expect("open");
    conn.execute_batch(&format!(
        "CREATE TABLE \"{table}\" (id INTEGER PRIMARY KEY, note TEXT); \
         INSERT INTO \"{table}\" VALUES (1, 'theirs'), (2, 'also theirs');"
    ))
    .expect("foreign table");
    dedup_conformance::foreign::refused_or_failing(SqliteStore::open(&path).await).await;
    let rows: Vec<(i64, String)> = conn
        .prepare(&format!("SELECT id, note FROM \"{table}\" ORDER BY id"))
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<Vec<_>, _>>()
        })
        .expect("the foreign table is still there");
    assert_eq!(
        rows,
        vec![(1, "theirs".to_string()), (2, "also theirs".to_string())],
        "the foreign rows must be left alone"
    );
    let columns: Vec<String> = conn
        .prepare(&format!(
            "SELECT name FROM pragma_table_info('{table}') ORDER BY cid"
        ))
        .and_then(|mut s| {
            s.query_map([], |r| r.get(0))?
                .collect::<Result<Vec<_>, _>>()
        })
        .expect("columns");
    assert_eq!(
        columns,
        ["id", "note"],
        "the foreign table's schema must be left alone"
    );
}
