//! Shared by the server-backed tests: the server URL, fresh stores and business tables.
#![allow(dead_code)] // each test binary uses a different part

use dedup_mysql::sqlx::{self, AssertSqlSafe, Connection, MySqlConnection};
use dedup_mysql::{MySqlConfig, MySqlStore, SqlSettings};

/// The variable naming the server's URL.
pub const URL_VAR: &str = "DEDUP_MYSQL_URL";

/// The store type the shared helpers open.
pub type Store = MySqlStore;

/// A configuration on `table` (the shared helpers set the clock and the pool).
pub fn config(table: &str) -> MySqlConfig {
    MySqlConfig::from(SqlSettings {
        table: table.into(),
        ..Default::default()
    })
}

#[path = "../../../sql/tests/clauses/common.rs"]
mod shared;
pub use shared::*;

/// The business table standing for the caller's own data next to `store`'s inbox table.
pub fn business_table(store: &MySqlStore) -> String {
    format!("`{}_biz`", store.config().table)
}

/// Create `store`'s business table (idempotent).
pub async fn create_business_table(store: &MySqlStore) {
    let ddl = format!(
        "CREATE TABLE IF NOT EXISTS {} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, \
         consumer VARBINARY(200) NOT NULL, message_id VARBINARY(255) NOT NULL, \
         label VARCHAR(200) NOT NULL, KEY by_key (consumer, message_id)) ENGINE = InnoDB",
        business_table(store)
    );
    sqlx::raw_sql(AssertSqlSafe(ddl))
        .execute(store.pool())
        .await
        .expect("create business table");
}

/// Insert a business row `(key, label)` on `conn` (inside the caller's transaction).
pub async fn insert_business_row(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    key: &dedup_core::Key,
    label: &str,
) {
    let sql = format!(
        "INSERT INTO {} (consumer, message_id, label) VALUES (?, ?, ?)",
        business_table(store)
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(key.consumer())
        .bind(key.message_id())
        .bind(label)
        .execute(conn)
        .await
        .expect("insert business row");
}

/// The committed business rows of `key`, in insertion order.
pub async fn business_rows(store: &MySqlStore, key: &dedup_core::Key) -> Vec<String> {
    let sql = format!(
        "SELECT label FROM {} WHERE consumer = ? AND message_id = ? ORDER BY seq",
        business_table(store)
    );
    sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(key.consumer())
        .bind(key.message_id())
        .fetch_all(store.pool())
        .await
        .expect("read business rows")
}

/// A transaction on `holder` locks the business row `(key's consumer, message_id)` (READ
/// COMMITTED: that row alone, not the gaps around it); then `conn`'s `FOR UPDATE NOWAIT`
/// of it is refused (MariaDB `1205`, MySQL 8 `3572`, both retryable). The holder then
/// rolls back. This is the conflict the `TxInbox` clauses provoke.
pub async fn refused_lock(
    store: &MySqlStore,
    holder: &mut MySqlConnection,
    conn: &mut MySqlConnection,
    key: &dedup_core::Key,
    message_id: &str,
) -> Result<(), sqlx::Error> {
    let mut other = holder
        .begin_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
        .await
        .expect("begin");
    let lock = |nowait: &str| {
        format!(
            "SELECT label FROM {} WHERE consumer = ? AND message_id = ? FOR UPDATE{nowait}",
            business_table(store)
        )
    };
    sqlx::query(AssertSqlSafe(lock("")))
        .bind(key.consumer())
        .bind(message_id)
        .fetch_all(&mut *other)
        .await
        .expect("the concurrent lock");
    let refused = sqlx::query(AssertSqlSafe(lock(" NOWAIT")))
        .bind(key.consumer())
        .bind(message_id)
        .fetch_all(conn)
        .await
        .map(drop);
    other.rollback().await.expect("rollback");
    refused
}
