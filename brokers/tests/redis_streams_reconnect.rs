//! A Redis Streams consumer whose connections the server drops mid-run (`CLIENT KILL` on
//! a PRIVATE Redis, never the shared one): it connects again by itself, and every entry is
//! handled exactly once. redis-rs's multiplexed connections do not reconnect; the receive
//! loop does, and a publisher connects again on its next publish.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_brokers::redis_streams::{StreamConsumer, StreamPublisher};
use dedup_brokers::{ConsumerConfig, Delivery, shutdown, with_inbox};
use dedup_core::outbox::Publisher;
use dedup_core::{Inbox, MemoryStore};
use support::private::Private;
use support::{Runs, row, wait_until};

const GROUP: &str = "billing";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_whose_connections_are_killed_reconnects_and_loses_nothing() {
    let redis = tokio::task::spawn_blocking(|| Private::start("redis", "DEDUP_REDIS_URL"))
        .await
        .unwrap();
    let client = redis::Client::open(redis.url.as_str()).unwrap();
    let mut admin = client.get_multiplexed_async_connection().await.unwrap();
    let stream = format!("dedup-reconnect-{}", uuid::Uuid::new_v4().simple());
    // A publisher per batch: its connection is killed with the consumer's.
    let publish = |ids: std::ops::Range<usize>| {
        let rows: Vec<_> = ids.map(|i| row(&stream, &format!("m-{i}"))).collect();
        let client = client.clone();
        async move {
            let publisher = StreamPublisher::connect(&client).await.unwrap();
            let results = publisher.publish_all(&rows).await;
            assert!(results.iter().all(Result::is_ok), "{results:?}");
        }
    };
    publish(0..100).await;

    let runs = Runs::default();
    let handler = {
        let runs = Arc::clone(&runs);
        with_inbox(
            Inbox::new(MemoryStore::new()),
            move |_lease, d: Delivery| {
                let runs = Arc::clone(&runs);
                async move {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    *runs
                        .lock()
                        .unwrap()
                        .entry(d.message_id.unwrap())
                        .or_default() += 1;
                    Ok::<_, std::io::Error>(None)
                }
            },
        )
    };
    let config = ConsumerConfig {
        in_flight: 4,
        retry_delay: Duration::from_millis(50),
        max_retry_delay: Duration::from_millis(200),
        reconnect_delay: Duration::from_millis(50),
        max_reconnect_delay: Duration::from_millis(500),
        ..ConsumerConfig::default()
    };
    let consumer = StreamConsumer::new(client.clone(), &stream, GROUP, "w1", config)
        .claim_idle(Duration::from_millis(300));
    let (stop, signal) = shutdown();
    let task = tokio::spawn(consumer.run(handler, signal));
    wait_until("some were handled", || runs.lock().unwrap().len() >= 20).await;

    // Every client but this one: the consumer's reads and acks connections (and the first
    // publisher's).
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(killed >= 1, "the consumer's connections were killed");
    publish(100..200).await;

    let deadline = Instant::now() + Duration::from_secs(30);
    while runs.lock().unwrap().len() < 200 {
        assert!(Instant::now() < deadline, "not all handled");
        assert!(!task.is_finished(), "run ended: {:?}", task.await);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert!(stats.reconnects >= 1, "{stats:?}");
    let runs = runs.lock().unwrap().clone();
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "handled more than once: {twice:?}");
    assert_eq!(runs.len(), 200);
    let _: () = redis::AsyncCommands::del(&mut admin, &stream)
        .await
        .unwrap();
    drop(redis);
}

/// A publisher whose connection the server killed fails the publish that meets it, then
/// connects again on the next one: every later publish succeeds and its entry is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_whose_connection_is_killed_reconnects_on_its_next_publish() {
    let redis = tokio::task::spawn_blocking(|| Private::start("redis", "DEDUP_REDIS_URL"))
        .await
        .unwrap();
    let client = redis::Client::open(redis.url.as_str()).unwrap();
    let mut admin = client.get_multiplexed_async_connection().await.unwrap();
    let stream = format!("dedup-reconnect-pub-{}", uuid::Uuid::new_v4().simple());
    let publisher = StreamPublisher::connect(&client)
        .await
        .unwrap()
        .reconnect_within(Duration::from_secs(5));
    publisher.publish(&row(&stream, "before")).await.unwrap();

    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(killed >= 1, "the publisher's connection was killed");

    // The first publish after the kill may meet the dead connection and fail; the next
    // ones connect again.
    let first = publisher.publish(&row(&stream, "meets-the-kill")).await;
    for i in 0..3 {
        publisher
            .publish(&row(&stream, &format!("after-{i}")))
            .await
            .unwrap_or_else(|e| {
                panic!("publish {i} after the kill failed (first: {first:?}): {e}")
            });
    }
    let results = publisher
        .publish_all(&[row(&stream, "batch-0"), row(&stream, "batch-1")])
        .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");

    let entries: redis::streams::StreamRangeReply =
        redis::AsyncCommands::xrange_all(&mut admin, &stream)
            .await
            .unwrap();
    let ids: Vec<String> = entries
        .ids
        .iter()
        .map(|e| e.get::<String>("message_id").unwrap())
        .collect();
    for id in [
        "before", "after-0", "after-1", "after-2", "batch-0", "batch-1",
    ] {
        assert!(ids.iter().any(|x| x == id), "{id} missing from {ids:?}");
    }
    drop(redis);
}
