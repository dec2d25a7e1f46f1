//! The conformance suite (lease-mode and transactional clauses, the model-based test)
//! against the real MySQL / MariaDB of `DEDUP_MYSQL_URL`, through the sqlx backends' shared
//! factory (`../../sql/tests/clauses/factory.rs`).

mod common;

use dedup_core::Key;
use dedup_mysql::sqlx::{self, MySql, MySqlConnection};
use dedup_mysql::{MySqlStore, TxInbox};

type Store = MySqlStore;
type Db = MySql;

#[path = "../../sql/tests/clauses/factory.rs"]
mod factory;
use factory::{SqlFactory, seed_id};

/// Nothing to set up before the conflicting run on MySQL (READ COMMITTED locks suffice).
async fn before_conflict(_conn: &mut MySqlConnection) {}

/// A concurrent transaction locks the seed row; then the handler's `FOR UPDATE NOWAIT` of
/// it is refused (`common::refused_lock`).
async fn conflict(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    key: &Key,
) -> std::result::Result<(), sqlx::Error> {
    let mut holder = store.pool().acquire().await.expect("a connection");
    common::refused_lock(store, &mut holder, conn, key, &seed_id(key)).await
}

dedup_conformance::suite!(SqlFactory);
dedup_conformance::transactional_suite!(SqlFactory);
dedup_conformance::tx_inbox_suite!(SqlFactory);
dedup_conformance::admin_suite!(SqlFactory);
