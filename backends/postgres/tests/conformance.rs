//! The conformance suite (lease-mode and transactional clauses, the model-based test)
//! against the real PostgreSQL of `DEDUP_POSTGRES_URL`, through the sqlx backends' shared
//! factory (`../../sql/tests/clauses/factory.rs`).

mod common;

use dedup_core::Key;
use dedup_postgres::sqlx::{self, AssertSqlSafe, PgConnection, Postgres};
use dedup_postgres::{PostgresStore, TxInbox};

type Store = PostgresStore;
type Db = Postgres;

#[path = "../../sql/tests/clauses/factory.rs"]
mod factory;
use factory::{SqlFactory, seed_id};

/// The conflicting run is SERIALIZABLE (set before its first statement).
async fn before_conflict(conn: &mut PgConnection) {
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
        common::business_table(store)
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
async fn conflict(
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

dedup_conformance::suite!(SqlFactory);
dedup_conformance::transactional_suite!(SqlFactory);
dedup_conformance::tx_inbox_suite!(SqlFactory);
dedup_conformance::admin_suite!(SqlFactory);
