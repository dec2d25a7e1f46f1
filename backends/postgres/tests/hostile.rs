//! Hostile input specific to PostgreSQL: a table with the store's name but a schema of
//! someone else's. Connecting (or any later call) is a typed error, never a panic, and the
//! foreign table and its rows are left as they were.

mod common;

use dedup_postgres::PostgresStore;
use dedup_postgres::sqlx::{self, AssertSqlSafe};
use dedup_postgres::{PostgresConfig, SqlSettings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_table_with_an_unexpected_schema_is_a_typed_error_and_left_alone() {
    let url = url_or_skip!();
    let table = common::unique_table("foreign");
    let admin = sqlx::PgPool::connect(&url).await.expect("connect");
    let qualified = format!("\"{}\".\"{table}\"", common::SCHEMA);
    for sql in [
        format!("CREATE SCHEMA IF NOT EXISTS \"{}\"", common::SCHEMA),
        format!("CREATE TABLE {qualified} (id int PRIMARY KEY, note text)"),
        format!("INSERT INTO {qualified} VALUES (1, 'theirs'), (2, 'also theirs')"),
    ] {
        // Racing test binaries may create the schema at once; the table is ours alone.
        let _ = sqlx::raw_sql(AssertSqlSafe(sql)).execute(&admin).await;
    }
    let config = PostgresConfig {
        schema: common::SCHEMA.into(),
        sql: SqlSettings {
            table: table.clone(),
            max_connections: 2,
            ..Default::default()
        },
        ..PostgresConfig::default()
    };
    dedup_conformance::foreign::refused_or_failing(PostgresStore::connect_with(&url, config).await)
        .await;
    let rows: Vec<(i32, String)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT id, note FROM {qualified} ORDER BY id"
    )))
    .fetch_all(&admin)
    .await
    .expect("the foreign table is still there");
    assert_eq!(
        rows,
        vec![(1, "theirs".to_string()), (2, "also theirs".to_string())],
        "the foreign rows must be left alone"
    );
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT column_name::text FROM information_schema.columns WHERE table_schema = $1 \
         AND table_name = $2 ORDER BY ordinal_position",
    )
    .bind(common::SCHEMA)
    .bind(&table)
    .fetch_all(&admin)
    .await
    .expect("columns");
    assert_eq!(
        columns,
        ["id", "note"],
        "the foreign table's schema must be left alone"
    );
}
