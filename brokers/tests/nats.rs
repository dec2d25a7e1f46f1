//! The NATS JetStream publisher and consumer against the real NATS server (`DEDUP_NATS_URL`).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_nats::jetstream::stream::Config as StreamConfig;
use async_nats::jetstream::{Context, message::StreamMessage};
use dedup_brokers::nats::{MSG_ID_HEADER, NatsConsumer, NatsPublisher};
use dedup_brokers::{ConsumerConfig, DEAD_LETTER_REASON, Shutdown, shutdown};
use dedup_core::outbox::Publisher;
use dedup_core::{InboxConfig, MemoryStore};
use support::{
    Runs, all_once, assert_one_at_a_time, commit_then_hang, config, counting, ids,
    one_at_a_time_probe, one_in_flight, poison, row, wait_until,
};

const DURABLE: &str = "billing";
/// JetStream's own duplicate window, short so the tests can publish copies it lets through.
const WINDOW: Duration = Duration::from_millis(100);

struct Fixture {
    client: async_nats::Client,
    js: Context,
    stream: String,
    subject: String,
    dead_stream: String,
    dead_subject: String,
}

impl Fixture {
    async fn new() -> Option<Fixture> {
        let url = dedup_conformance::server_url("DEDUP_NATS_URL")?;
        let client = async_nats::connect(url.as_str())
            .await
            .expect("connect to NATS");
        let js = async_nats::jetstream::new(client.clone());
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let fx = Fixture {
            client,
            js,
            stream: format!("DEDUP_{tag}"),
            subject: format!("dedup.{tag}.orders"),
            dead_stream: format!("DEDUP_{tag}_DEAD"),
            dead_subject: format!("dedup.{tag}.dead"),
        };
        for (name, subject) in [
            (&fx.stream, &fx.subject),
            (&fx.dead_stream, &fx.dead_subject),
        ] {
            fx.js
                .create_stream(StreamConfig {
                    name: name.clone(),
                    subjects: vec![subject.clone()],
                    duplicate_window: WINDOW,
                    ..StreamConfig::default()
                })
                .await
                .unwrap();
        }
        Some(fx)
    }

    fn consumer(&self, config: ConsumerConfig) -> NatsConsumer {
        NatsConsumer::new(self.js.clone(), &self.stream, DURABLE, config)
            .dead_letter_subject(&self.dead_subject)
            .ack_wait(Duration::from_millis(500))
    }

    async fn messages(&self, stream: &str) -> Vec<StreamMessage> {
        let s = self.js.get_stream(stream).await.unwrap();
        let mut out = Vec::new();
        for seq in 1.. {
            match s.get_raw_message(seq).await {
                Ok(m) => out.push(m),
                Err(_) => break,
            }
        }
        out
    }

    async fn wait_for_dead(&self, n: usize) -> Vec<StreamMessage> {
        for _ in 0..200 {
            let dead = self.messages(&self.dead_stream).await;
            if dead.len() >= n {
                return dead;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("fewer than {n} dead letters");
    }

    async fn cleanup(self) {
        for s in [&self.stream, &self.dead_stream] {
            let _ = self.js.delete_stream(s).await;
        }
    }
}

fn header<'a>(m: &'a StreamMessage, name: &str) -> Option<&'a str> {
    m.headers.get(name).map(|v| v.as_str())
}

#[tokio::test]
async fn a_published_row_arrives_with_its_message_id_and_headers() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = NatsPublisher::from_client(fx.client.clone());
    publisher
        .publish(&row(&fx.subject, "order-1"))
        .await
        .unwrap();
    let results = publisher
        .publish_all(&[row(&fx.subject, "order-2"), row(&fx.subject, "order-3")])
        .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let got = fx.messages(&fx.stream).await;
    let ids: Vec<_> = got
        .iter()
        .map(|m| header(m, MSG_ID_HEADER).unwrap())
        .collect();
    assert_eq!(ids, ["order-1", "order-2", "order-3"]);
    assert_eq!(header(&got[0], "tenant"), Some("acme"));
    assert_eq!(&got[0].payload[..], b"payload of order-1");
    let nowhere = publisher
        .publish(&row("dedup.nobody.listens", "order-4"))
        .await;
    assert!(nowhere.is_err(), "a subject no stream captures is not Ok");
    fx.cleanup().await;
}

#[tokio::test]
async fn duplicates_published_on_purpose_are_acked_without_running_the_handler() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = NatsPublisher::from_client(fx.client.clone());
    for id in ["a", "b", "c", "a", "a"] {
        // Past JetStream's duplicate window, so the stream keeps every copy.
        tokio::time::sleep(WINDOW + Duration::from_millis(20)).await;
        publisher.publish(&row(&fx.subject, id)).await.unwrap();
    }
    assert_eq!(fx.messages(&fx.stream).await.len(), 5);
    let (runs, calls) = (Runs::default(), Arc::new(AtomicU32::new(0)));
    let handler = counting(
        &Arc::new(MemoryStore::new()),
        InboxConfig::default(),
        &runs,
        &calls,
        Duration::ZERO,
    );
    let (stop, signal) = shutdown();
    let task = tokio::spawn(fx.consumer(config()).run(handler, signal));
    wait_until("five settled", || calls.load(Ordering::SeqCst) == 5).await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_eq!((stats.processed, stats.duplicates), (3, 2), "{stats:?}");
    assert!(all_once(&runs, 3));
    fx.cleanup().await;
}

#[tokio::test]
async fn a_consumer_killed_before_its_ack_has_its_redelivery_absorbed() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    NatsPublisher::from_client(fx.client.clone())
        .publish(&row(&fx.subject, "order-1"))
        .await
        .unwrap();
    let store = Arc::new(MemoryStore::new());
    let runs = Runs::default();
    let committed = Arc::new(AtomicU32::new(0));
    let a = fx.consumer(config()).run(
        commit_then_hang(&store, &runs, &committed),
        Shutdown::never(),
    );
    let task_a = tokio::spawn(a);
    wait_until("A committed", || committed.load(Ordering::SeqCst) == 1).await;
    task_a.abort();
    let _ = task_a.await;

    let calls = Arc::new(AtomicU32::new(0));
    let handler = counting(
        &store,
        InboxConfig::default(),
        &runs,
        &calls,
        Duration::ZERO,
    );
    let (stop, signal) = shutdown();
    let task_b = tokio::spawn(fx.consumer(config()).run(handler, signal));
    wait_until("B got the redelivery", || calls.load(Ordering::SeqCst) == 1).await;
    stop.shut_down();
    let stats = task_b.await.unwrap().unwrap();
    assert_eq!((stats.processed, stats.duplicates), (0, 1), "{stats:?}");
    assert!(all_once(&runs, 1));
    fx.cleanup().await;
}

#[tokio::test]
async fn messages_without_an_id_or_older_than_the_floor_are_dead_lettered_unhandled() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    fx.js
        .publish(fx.subject.clone(), "no id".into())
        .await
        .unwrap()
        .await
        .unwrap();
    NatsPublisher::from_client(fx.client.clone())
        .publish(&row(&fx.subject, "old"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (runs, calls) = (Runs::default(), Arc::new(AtomicU32::new(0)));
    let handler = counting(
        &Arc::new(MemoryStore::new()),
        InboxConfig::default(),
        &runs,
        &calls,
        Duration::ZERO,
    );
    let floor = ConsumerConfig {
        max_age: Some(Duration::from_millis(200)),
        ..config()
    };
    let (stop, signal) = shutdown();
    let task = tokio::spawn(fx.consumer(floor).run(handler, signal));
    let dead = fx.wait_for_dead(2).await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    let mut reasons: Vec<_> = dead
        .iter()
        .map(|m| header(m, DEAD_LETTER_REASON).unwrap().to_owned())
        .collect();
    reasons.sort();
    assert_eq!(reasons[0], "no message id");
    assert!(reasons[1].starts_with("older than"), "{reasons:?}");
    assert_eq!(stats.refused, 2, "{stats:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    fx.cleanup().await;
}

#[tokio::test]
async fn a_poison_message_reaches_the_dead_letter_subject_after_max_attempts() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    NatsPublisher::from_client(fx.client.clone())
        .publish(&row(&fx.subject, "poison"))
        .await
        .unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let (stop, signal) = shutdown();
    let task = tokio::spawn(
        fx.consumer(config())
            .run(poison(MemoryStore::new(), 3, &runs), signal),
    );
    let dead = fx.wait_for_dead(1).await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_eq!(header(&dead[0], MSG_ID_HEADER), Some("poison"));
    assert!(
        header(&dead[0], DEAD_LETTER_REASON)
            .unwrap()
            .contains("attempts used up")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!((stats.errors, stats.dead_letters), (3, 1), "{stats:?}");
    fx.cleanup().await;
}

#[tokio::test]
async fn shutdown_with_messages_in_flight_loses_none() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = NatsPublisher::from_client(fx.client.clone());
    let rows: Vec<_> = (0..20)
        .map(|i| row(&fx.subject, &format!("m-{i}")))
        .collect();
    assert!(publisher.publish_all(&rows).await.iter().all(Result::is_ok));
    let store = Arc::new(MemoryStore::new());
    let runs = Runs::default();
    let calls = Arc::new(AtomicU32::new(0));
    let slow = || {
        counting(
            &store,
            InboxConfig::default(),
            &runs,
            &calls,
            Duration::from_millis(100),
        )
    };
    let (stop, signal) = shutdown();
    let task = tokio::spawn(fx.consumer(config()).run(slow(), signal));
    wait_until("some ran", || runs.lock().unwrap().len() >= 2).await;
    stop.shut_down();
    let first = task.await.unwrap().unwrap();
    assert!(first.processed < 20, "{first:?}");
    let (stop, signal) = shutdown();
    let task = tokio::spawn(fx.consumer(config()).run(slow(), signal));
    wait_until("all ran", || runs.lock().unwrap().len() == 20).await;
    stop.shut_down();
    let second = task.await.unwrap().unwrap();
    assert_eq!(first.processed + second.processed, 20);
    assert!(all_once(&runs, 20));
    fx.cleanup().await;
}

#[tokio::test]
async fn with_one_in_flight_messages_run_one_at_a_time_in_stream_order() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = NatsPublisher::from_client(fx.client.clone());
    for id in ids(10) {
        publisher.publish(&row(&fx.subject, &id)).await.unwrap();
    }
    let (order, most) = (Arc::default(), Arc::new(AtomicU32::new(0)));
    let one = one_in_flight();
    let (stop, signal) = shutdown();
    let task = tokio::spawn(
        fx.consumer(one)
            .run(one_at_a_time_probe(&order, &most), signal),
    );
    wait_until("all ran", || order.lock().unwrap().len() == 10).await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_one_at_a_time(&stats, &order, &most, 10);
    fx.cleanup().await;
}
