//! Hostile input specific to MySQL: a table with the store's name but a layout of someone
//! else's. Connecting (or any later call) is a typed error, never a panic, and the foreign
//! table and its rows are left as they were.

mod common;

use dedup_mysql::sqlx::{self, AssertSqlSafe};
use dedup_mysql::{MySqlConfig, MySqlStore, SqlSettings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_table_with_an_unexpected_schema_is_a_typed_error_and_left_alone() {
    let url = url_or_skip!();
    let table = common::unique_table("foreign");
    let admin = sqlx::MySqlPool::connect(&url).await.expect("connect");
    for sql in [
        format!("CREATE TABLE `{table}` (id INT PRIMARY KEY, note TEXT)"),
        format!("INSERT INTO `{table}` VALUES (1, 'theirs'), (2, 'also theirs')"),
    ] {
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&admin)
            .await
            .expect("the foreign table");
    }
    let config = MySqlConfig::from(SqlSettings {
        table: table.clone(),
        max_connections: 2,
        ..Default::default()
    });
    dedup_conformance::foreign::refused_or_failing(MySqlStore::connect_with(&url, config).await)
        .await;
    let rows: Vec<(i32, String)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT id, note FROM `{table}` ORDER BY id"
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
        "SELECT CAST(column_name AS CHAR) FROM information_schema.columns \
         WHERE table_schema = DATABASE() AND table_name = ? ORDER BY ordinal_position",
    )
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
