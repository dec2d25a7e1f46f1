//! `KafkaLag` against a real Kafka-protocol broker (`DEDUP_KAFKA_BROKERS`; Tansu): the
//! group's lag is what it has not consumed, and drops to zero once its consumer settled it.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use dedup_brokers::backlog::Backlog;
use dedup_brokers::kafka::{KafkaConsumer, KafkaLag, KafkaPublisher};
use dedup_brokers::{BrokerError, shutdown};
use dedup_core::outbox::Publisher;
use dedup_core::{InboxConfig, MemoryStore};
use support::{Runs, config, counting, kafka, row};

/// Reads `lag` until it is `want`, or fails after 30 s naming the last reading.
async fn until(lag: &KafkaLag, want: u64) {
    let start = Instant::now();
    loop {
        let got = lag.backlog().await.expect("the lag is read");
        if got == want {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "lag stays {got}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lag_is_what_the_group_has_not_consumed() {
    let Some(brokers) = dedup_conformance::server_url("DEDUP_KAFKA_BROKERS") else {
        return;
    };
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let (topic, dead, group) = (
        format!("dedup-lag-{tag}"),
        format!("dedup-lag-{tag}-dead"),
        format!("dedup-lag-{tag}-group"),
    );
    kafka::create_topics(&brokers, &[&topic, &dead]).await;
    let lag = KafkaLag::new(&brokers, &topic, &group).unwrap();
    assert_eq!(lag.what(), "consumer-group lag");
    assert_eq!(lag.backlog().await.unwrap(), 0, "an empty topic");

    let publisher = KafkaPublisher::new(&brokers).unwrap();
    for i in 0..6 {
        publisher
            .publish(&row(&topic, &format!("m-{i}")))
            .await
            .unwrap();
    }
    // The group committed nothing yet: all six wait.
    until(&lag, 6).await;

    let runs = Runs::default();
    let calls = Arc::new(AtomicU32::new(0));
    let handler = counting(
        &Arc::new(MemoryStore::new()),
        InboxConfig::default(),
        &runs,
        &calls,
        Duration::ZERO,
    );
    let consumer = KafkaConsumer::new(&brokers, &group, &topic, &dead, config())
        .set("session.timeout.ms", "2000");
    let (stop, signal) = shutdown();
    let running = tokio::spawn(consumer.run(handler, signal));
    support::wait_until("six settled", || calls.load(Ordering::SeqCst) == 6).await;
    until(&lag, 0).await;
    stop.shut_down();
    running.await.unwrap().unwrap();

    let missing = KafkaLag::new(&brokers, &format!("dedup-lag-{tag}-none"), &group).unwrap();
    let refused = missing.backlog().await;
    assert!(
        matches!(refused, Err(BrokerError::Refused { .. })),
        "{refused:?}"
    );
}
