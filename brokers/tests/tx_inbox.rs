//! `with_tx_inbox`: a Redis Streams consumer (`DEDUP_REDIS_URL`) over PostgreSQL's
//! `TxInbox` (`DEDUP_POSTGRES_URL`).

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dedup_brokers::redis_streams::{StreamConsumer, StreamPublisher};
use dedup_brokers::{Delivery, shutdown, with_tx_inbox};
use dedup_core::Lease;
use dedup_core::outbox::Publisher;
use dedup_postgres::sqlx::{self, AssertSqlSafe, PgConnection};
use dedup_postgres::{PostgresConfig, PostgresStore, SqlSettings, TxInbox};
use redis::AsyncCommands;
use support::{config, row, wait_until};

/// A duplicate runs the handler once, and the handler's write commits with the claim: a
/// failed run leaves no row, the next delivery writes it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_inbox_handler_writes_once_with_the_completion() {
    writes_once_with_the_completion(false).await;
}

/// The same in the service's own transactions: the inbox built `with_begin` on a pool of
/// the test's own, the one-line consumer over `handle_in`'s use case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_inbox_handler_in_your_own_transactions_writes_once_with_the_completion() {
    writes_once_with_the_completion(true).await;
}

/// The scenario; with `own`, the transactions are begun on the test's own pool.
async fn writes_once_with_the_completion(own: bool) {
    let (Some(pg_url), Some(redis_url)) = (
        dedup_conformance::server_url("DEDUP_POSTGRES_URL"),
        dedup_conformance::server_url("DEDUP_REDIS_URL"),
    ) else {
        return;
    };
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let store = PostgresStore::connect_with(
        &pg_url,
        PostgresConfig {
            sql: SqlSettings {
                table: format!("brokers_tx_{suffix}"),
                ..Default::default()
            },
            ..PostgresConfig::default()
        },
    )
    .await
    .unwrap();
    let invoices = format!("brokers_tx_invoices_{suffix}");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {invoices} (message_id TEXT NOT NULL, fence BIGINT NOT NULL)"
    )))
    .execute(store.pool())
    .await
    .unwrap();

    let client = redis::Client::open(redis_url.as_str()).unwrap();
    let stream = format!("dedup-brokers-tx-{suffix}");
    let publisher = StreamPublisher::connect(&client).await.unwrap();
    // "paid" three times (duplicates), "refund" once: its first run writes, then fails.
    for id in ["paid", "paid", "refund", "paid"] {
        publisher.publish(&row(&stream, id)).await.unwrap();
    }

    let mut inbox = TxInbox::new(store.clone());
    if own {
        inbox = inbox.with_begin(sqlx::PgPool::connect(&pg_url).await.unwrap());
    }
    let runs: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let handler = {
        let runs = Arc::clone(&runs);
        let insert = format!("INSERT INTO {invoices} (message_id, fence) VALUES ($1, $2)");
        with_tx_inbox(
            inbox,
            move |conn: &mut PgConnection, lease: &Lease, delivery: Delivery| {
                let runs = Arc::clone(&runs);
                let insert = insert.clone();
                Box::pin(async move {
                    let id = delivery.message_id.clone().unwrap();
                    let run = {
                        let mut runs = runs.lock().unwrap();
                        let n = runs.entry(id.clone()).or_default();
                        *n += 1;
                        *n
                    };
                    sqlx::query(AssertSqlSafe(insert))
                        .bind(&id)
                        .bind(lease.fence as i64)
                        .execute(&mut *conn)
                        .await?;
                    if id == "refund" && run == 1 {
                        return Err("the first refund run fails after its write".into());
                    }
                    Ok::<_, dedup_core::BoxError>(Some(b"invoiced".to_vec()))
                })
            },
        )
    };

    let consumer = StreamConsumer::new(client.clone(), &stream, "billing", "w1", config())
        .claim_idle(Duration::from_millis(150));
    let (trigger, signal) = shutdown();
    let task = tokio::spawn(consumer.run(handler, signal));
    wait_until("refund handled on its redelivery", || {
        runs.lock().unwrap().get("refund") == Some(&2)
    })
    .await;
    // Time for the duplicates of "paid" to be settled too.
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let v: redis::Value = redis::cmd("XPENDING")
            .arg(&stream)
            .arg("billing")
            .query_async(&mut conn)
            .await
            .unwrap();
        if matches!(&v, redis::Value::Array(items) if items.first() == Some(&redis::Value::Int(0)))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "deliveries still pending: {v:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    trigger.shut_down();
    let stats = task.await.unwrap().unwrap();

    assert_eq!(
        runs.lock().unwrap().get("paid"),
        Some(&1),
        "a duplicate ran the handler"
    );
    assert_eq!(stats.processed, 2, "{stats:?}");
    assert_eq!(stats.duplicates, 2, "{stats:?}");
    assert_eq!(stats.errors, 1, "{stats:?}");
    let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT message_id, count(*) FROM {invoices} GROUP BY message_id ORDER BY message_id"
    )))
    .fetch_all(store.pool())
    .await
    .unwrap();
    // The failed refund run's write was rolled back with its transaction.
    assert_eq!(rows, vec![("paid".into(), 1), ("refund".into(), 1)]);

    sqlx::query(AssertSqlSafe(format!("DROP TABLE {invoices}")))
        .execute(store.pool())
        .await
        .unwrap();
    sqlx::query(AssertSqlSafe(format!("DROP TABLE {}", store.table())))
        .execute(store.pool())
        .await
        .unwrap();
    let _: () = conn.del(&stream).await.unwrap();
}
