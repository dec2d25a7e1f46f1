//! The two steps by which the conformance suite provokes a conflict PostgreSQL asks to
//! retry, for the test binaries that run the suite (`#[path]`-included beside `common`
//! and the shared factory's `seed_id`).

use dedup_core::Key;
use dedup_postgres::PostgresStore;
use dedup_postgres::sqlx::{self, AssertSqlSafe, PgConnection};

use crate::common::business_table;
use crate::seed_id;

/// The conflicting run is SERIALIZABLE (set before its first statement).
pub async fn before_conflict(conn: &mut PgConnection) {
    sqlx::query("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        .execute(conn)
        .await
        .expect("serializable");
}

/// Bump the seed row of `key` on `conn`.
async fn bump_seed(
    store: &PostgresStore,
    conn: &mut PgConnection,
    key: &Key,
) -> std::result::Result<(), sqlx::Error> {
    let sql = format!(
        "UPDATE {} SET label = label || '+' WHERE consumer = $1 AND message_id = $2",
        business_table(store)
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(key.consumer())
        .bind(seed_id(key))
        .execute(conn)
        .await
        .map(drop)
}

/// Another connection bumps the seed row after the handler's snapshot; the handler's own
/// bump then fails with `40001` (serialization failure, retryable).
pub async fn conflict(
    store: &PostgresStore,
    conn: &mut PgConnection,
    key: &Key,
) -> std::result::Result<(), sqlx::Error> {
    let mut other = store.pool().acquire().await.expect("connection");
    bump_seed(store, &mut other, key)
        .await
        .expect("the concurrent write");
    bump_seed(store, conn, key).await
}
