//! The business table standing for the caller's own data beside a store's inbox table.

use dedup_postgres::PostgresStore;
use dedup_postgres::sqlx::{self, AssertSqlSafe, PgConnection};

use super::SCHEMA;

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
