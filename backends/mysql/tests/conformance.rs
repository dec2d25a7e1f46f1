//! The conformance suite (lease-mode and transactional clauses, the model-based test)
//! against the real MySQL / MariaDB of `DEDUP_MYSQL_URL`, through the sqlx backends' shared
//! factory (`../../sql/tests/clauses/factory.rs`).

mod common;

use dedup_core::Key;
use dedup_mysql::sqlx::{self, AssertSqlSafe, MySql, MySqlConnection};
use dedup_mysql::{MySqlStore, TxInbox};

type Store = MySqlStore;
type Db = MySql;

#[path = "../../sql/tests/clauses/factory.rs"]
mod factory;
use factory::{SqlFactory, seed_id};

/// Nothing to set up before the conflicting run on MySQL (READ COMMITTED locks suffice).
async fn before_conflict(_conn: &mut MySqlConnection) {}

/// A concurrent transaction locks the seed row (READ COMMITTED: that row alone, not the
/// gaps around it, where the handler's own uncommitted row lies); then the handler's
/// `FOR UPDATE NOWAIT` of it is refused (MariaDB `1205`, MySQL 8 `3572`, both retryable).
async fn conflict(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    key: &Key,
) -> std::result::Result<(), sqlx::Error> {
    let mut other = store
        .pool()
        .begin_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
        .await
        .expect("begin");
    let lock = |nowait: &str| {
        format!(
            "SELECT label FROM {} WHERE consumer = ? AND message_id = ? FOR UPDATE{nowait}",
            common::business_table(store)
        )
    };
    sqlx::query(AssertSqlSafe(lock("")))
        .bind(key.consumer())
        .bind(seed_id(key))
        .fetch_all(&mut *other)
        .await
        .expect("the concurrent lock");
    let refused = sqlx::query(AssertSqlSafe(lock(" NOWAIT")))
        .bind(key.consumer())
        .bind(seed_id(key))
        .fetch_all(conn)
        .await
        .map(drop);
    other.rollback().await.expect("rollback");
    refused
}

dedup_conformance::suite!(SqlFactory);
dedup_conformance::transactional_suite!(SqlFactory);
dedup_conformance::tx_inbox_suite!(SqlFactory);
dedup_conformance::admin_suite!(SqlFactory);
