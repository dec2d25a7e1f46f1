//! `health()`: a consumer's live state against the real Redis (`DEDUP_REDIS_URL`).

mod support;

use std::sync::Arc;
use std::time::Duration;

use dedup_brokers::redis_streams::{StreamConsumer, StreamPublisher};
use dedup_brokers::{Delivery, shutdown, with_inbox};
use dedup_core::outbox::Publisher;
use dedup_core::{Inbox, InboxConfig, MemoryStore};
use redis::AsyncCommands;
use support::{config, row, wait_until};
use tokio::sync::Semaphore;

/// Connected while running, handlers in flight counted until they settle, last settle set,
/// not connected once `run` returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_a_running_consumer() {
    let Some(url) = dedup_conformance::server_url("DEDUP_REDIS_URL") else {
        return;
    };
    let client = redis::Client::open(url.as_str()).unwrap();
    let stream = format!("dedup-brokers-health-{}", uuid::Uuid::new_v4().simple());
    let consumer = StreamConsumer::new(client.clone(), &stream, "billing", "w1", config());
    let health = consumer.health();
    let before = health.snapshot();
    assert!(!before.connected, "{before:?}");
    assert_eq!(before.in_flight, 0);
    assert_eq!(before.last_settle, None);

    // Handlers wait for a permit each: both stay in flight until the test releases them.
    let gate = Arc::new(Semaphore::new(0));
    let handler = {
        let gate = Arc::clone(&gate);
        with_inbox(
            Inbox::from_arc(Arc::new(MemoryStore::new()), InboxConfig::default()),
            move |_lease, _delivery: Delivery| {
                let gate = Arc::clone(&gate);
                async move {
                    gate.acquire().await.unwrap().forget();
                    Ok::<_, std::io::Error>(None)
                }
            },
        )
    };
    let (trigger, signal) = shutdown();
    let task = tokio::spawn(consumer.run(handler, signal));
    wait_until("connected", || health.snapshot().connected).await;

    let publisher = StreamPublisher::connect(&client).await.unwrap();
    publisher.publish(&row(&stream, "m-1")).await.unwrap();
    publisher.publish(&row(&stream, "m-2")).await.unwrap();
    wait_until("two in flight", || health.snapshot().in_flight == 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let held = health.snapshot();
    assert!(held.connected, "{held:?}");
    assert_eq!(held.in_flight, 2, "{held:?}");
    assert_eq!(held.last_settle, None, "nothing settled yet: {held:?}");

    gate.add_permits(2);
    wait_until("both settled", || {
        let now = health.snapshot();
        now.in_flight == 0 && now.last_settle.is_some()
    })
    .await;
    trigger.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_eq!(stats.processed, 2, "{stats:?}");
    let after = health.snapshot();
    assert!(!after.connected, "{after:?}");
    assert_eq!(after.reconnects, 0, "{after:?}");

    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = conn.del(&stream).await.unwrap();
}
