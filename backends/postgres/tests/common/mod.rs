//! Shared by the server-backed tests: the server URL, fresh stores and business tables.
#![allow(dead_code)] // each test binary uses a different part

use dedup_postgres::sqlx::{self, AssertSqlSafe, PgConnection};
use dedup_postgres::{PostgresConfig, PostgresStore, SqlSettings};

/// The schema every test table lives in (created by the first migrate).
pub const SCHEMA: &str = "dedup_test";

/// The variable naming the server's URL.
pub const URL_VAR: &str = "DEDUP_POSTGRES_URL";

/// The store type the shared helpers open.
pub type Store = PostgresStore;

/// A configuration on `table` (the shared helpers set the clock and the pool).
pub fn config(table: &str) -> PostgresConfig {
    PostgresConfig {
        schema: SCHEMA.into(),
        sql: SqlSettings {
            table: table.into(),
            ..Default::default()
        },
        ..PostgresConfig::default()
    }
}

#[path = "../../../sql/tests/clauses/common.rs"]
mod shared;
pub use shared::*;

/// The business table standing for the caller's own data next to `store`'s inbox table.
pub fn business_table(store: &PostgresStore) -> String {
    format!("\"{SCHEMA}\".\"{}_biz\"", store.config().table)
}

/// Create `store`'s business table (idempotent, safe to race).
pub async fn create_business_table(store: &PostgresStore) {
    let mut tx = store.pool().begin().await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(business_table(store))
        .execute(&mut *tx)
        .await
        .expect("lock");
    let ddl = format!(
        "CREATE TABLE IF NOT EXISTS {} (seq bigserial PRIMARY KEY, consumer text NOT NULL, \
         message_id text NOT NULL, label text NOT NULL)",
        business_table(store)
    );
    sqlx::query(AssertSqlSafe(ddl))
        .execute(&mut *tx)
        .await
        .expect("create business table");
    tx.commit().await.expect("commit");
}

/// Insert a business row `(key, label)` on `conn` (inside the caller's transaction).
pub async fn insert_business_row(
    store: &PostgresStore,
    conn: &mut PgConnection,
    key: &dedup_core::Key,
    label: &str,
) {
    let sql = format!(
        "INSERT INTO {} (consumer, message_id, label) VALUES ($1, $2, $3)",
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
pub async fn business_rows(store: &PostgresStore, key: &dedup_core::Key) -> Vec<String> {
    let sql = format!(
        "SELECT label FROM {} WHERE consumer = $1 AND message_id = $2 ORDER BY seq",
        business_table(store)
    );
    sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(key.consumer())
        .bind(key.message_id())
        .fetch_all(store.pool())
        .await
        .expect("read business rows")
}
