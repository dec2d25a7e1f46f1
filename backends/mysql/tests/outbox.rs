//! The outbox on MySQL / MariaDB (`DEDUP_MYSQL_URL`): the conformance clauses
//! (`outbox_suite!`, relays racing over ordering keys among them), the tests shared with
//! PostgreSQL (`backends/sql/tests/clauses/outbox.rs`: producers of one key taking turns,
//! the consumer outbox from a `TxInbox` handler), and the relay polling (no wake-ups).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_core::Error;
use dedup_core::outbox::{MemoryPublisher, OutboxMessage, OutboxStore, Relay, RelayConfig};
use dedup_mysql::sqlx::{self, AssertSqlSafe};
use dedup_mysql::{MySqlConfig, MySqlStore, SqlSettings, TxInbox};

/// What the shared sqlx outbox tests (`backends/sql/tests/clauses/outbox.rs`) run on.
type Store = MySqlStore;
/// This backend's sqlx database, for the shared outbox factory's transactions.
type Db = sqlx::MySql;
/// This backend's sqlx connection, for the shared tests' handlers.
type Conn = sqlx::MySqlConnection;

#[path = "../../sql/tests/clauses/outbox.rs"]
mod sql_clauses;
use sql_clauses::{SqlOutboxFactory, enqueue};

dedup_conformance::outbox_suite!(SqlOutboxFactory);

/// Opened without migrating, the outbox of a table whose outbox was never created is
/// refused with `SchemaNotMigrated`; `migrate` creates it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmigrated_outbox_is_refused_until_migrate() {
    let url = url_or_skip!();
    let store = common::store(&url, "outbox_unmigrated", None).await;
    let config = store.config().clone();
    let outbox = config.outbox_table_name();
    let mut conn = store.pool().acquire().await.unwrap();
    sqlx::query(AssertSqlSafe(format!("DROP TABLE `{outbox}`")))
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("DELETE FROM dedup_schema_versions WHERE table_name = ?")
        .bind(&outbox)
        .execute(&mut *conn)
        .await
        .unwrap();
    let readonly = MySqlStore::connect_with(
        &url,
        MySqlConfig::from(SqlSettings {
            migrate: false,
            ..config.sql.clone()
        }),
    )
    .await
    .expect("the records table is current");
    let err = readonly.outbox().stats().await.unwrap_err();
    assert!(matches!(err, Error::SchemaNotMigrated { .. }), "{err:?}");
    store.migrate().await.unwrap();
    let again = MySqlStore::connect_with(
        &url,
        MySqlConfig::from(SqlSettings {
            migrate: false,
            ..config.sql
        }),
    )
    .await
    .unwrap();
    assert_eq!(again.outbox().stats().await.unwrap().pending, 0);
}

/// The relay has no wake-ups on MySQL: it polls, and a committed row goes out within the
/// poll interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_polls() {
    let url = url_or_skip!();
    let store = common::store(&url, "outbox_poll", None).await;
    assert!(store.outbox().wakeups().await.unwrap().is_none());
    let publisher = Arc::new(MemoryPublisher::new());
    let relay = Relay::new(Arc::new(store.outbox()), publisher.clone())
        .with_config(RelayConfig::default().poll_interval(Duration::from_millis(100)))
        .start()
        .expect("the relay starts");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let m = OutboxMessage::new("orders", "polled-1", b"x".to_vec()).unwrap();
    let committed = Instant::now();
    assert_eq!(enqueue(&store, &[m]).await, 1);
    while publisher.message_ids().is_empty() {
        assert!(
            committed.elapsed() < Duration::from_secs(2),
            "not published within 2 s of the commit with a 100 ms poll"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(publisher.message_ids(), vec!["polled-1".to_owned()]);
    relay.stop().await;
}

/// A table of the outbox's name that the store did not create is refused, not adopted,
/// and left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_table_of_the_outbox_name_is_refused() {
    let url = url_or_skip!();
    let table = common::unique_table("outbox_foreign");
    let config = MySqlConfig::from(SqlSettings {
        table: table.clone(),
        outbox_table: Some(format!("{table}_ob")),
        ..Default::default()
    });
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE `{table}_ob` (id BIGINT PRIMARY KEY, note TEXT)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let err = MySqlStore::connect_with(&url, config).await.unwrap_err();
    assert!(err.to_string().contains("not a dedup outbox"), "{err}");
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(column_name AS CHAR) FROM information_schema.columns \
         WHERE table_schema = DATABASE() AND table_name = ? ORDER BY ordinal_position",
    )
    .bind(format!("{table}_ob"))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(columns, ["id", "note"]);
}
