//! A MariaDB server that crashes and restarts under a live store (`SIGKILL`: no shutdown,
//! InnoDB redo-log recovery on start): every acknowledged commit, its outcome and a live
//! lease survive; the store's pool reconnects by itself, the first operations failing at
//! most with a retryable error.
//!
//! The test runs its own server through `scripts/services.sh` in a private state dir (the
//! shared test server must not be restarted under the other tests), with
//! `innodb_flush_log_at_trx_commit = 1`: the scripts' server runs with 2 for speed, which
//! survives a killed server but not a machine crash.

use private_server::Server;

use dedup_conformance::restart::acknowledged_records_survive_a_restart;
use dedup_mysql::{MySqlStore, sqlx};

#[path = "../../sql/tests/clauses/private_server.rs"]
mod private_server;

/// A private MariaDB for the test tagged `tag`.
fn server(tag: &str) -> Option<Server> {
    Server::start("mariadb", "DEDUP_MYSQL_URL", tag)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_and_restarted_server_keeps_every_acknowledged_commit_and_lease() {
    let Some(server) = server("commits") else {
        return;
    };
    let admin = sqlx::MySqlPool::connect(&server.url)
        .await
        .expect("admin connection");
    sqlx::raw_sql("SET GLOBAL innodb_flush_log_at_trx_commit = 1")
        .execute(&admin)
        .await
        .expect("durable commits");
    admin.close().await;

    let store = MySqlStore::connect(&server.url).await.expect("connect");
    acknowledged_records_survive_a_restart(&store, || server.crash_restart(None)).await;
}
