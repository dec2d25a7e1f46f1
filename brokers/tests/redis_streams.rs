//! The Redis Streams publisher and consumer against the real Redis (`DEDUP_REDIS_URL`).

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dedup_brokers::redis_streams::{StreamConsumer, StreamPublisher, dead_stream};
use dedup_brokers::{ConsumerConfig, DEAD_LETTER_REASON, Shutdown, shutdown};
use dedup_core::outbox::Publisher;
use dedup_core::{InboxConfig, MemoryStore};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redis::streams::StreamRangeReply;
use support::{
    Runs, all_once, assert_one_at_a_time, assert_retried_in_process, commit_then_hang, config,
    counting, ids, one_at_a_time_probe, one_in_flight, poison, row, transient_once, wait_until,
};

const GROUP: &str = "billing";
const IDLE: Duration = Duration::from_millis(150);

struct Fixture {
    client: redis::Client,
    conn: MultiplexedConnection,
    stream: String,
}

impl Fixture {
    async fn new() -> Option<Fixture> {
        let url = dedup_conformance::server_url("DEDUP_REDIS_URL")?;
        let client = redis::Client::open(url.as_str()).unwrap();
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        let stream = format!("dedup-brokers-{}", uuid::Uuid::new_v4().simple());
        Some(Fixture {
            client,
            conn,
            stream,
        })
    }

    fn consumer(&self, worker: &str, config: ConsumerConfig) -> StreamConsumer {
        StreamConsumer::new(self.client.clone(), &self.stream, GROUP, worker, config)
            .claim_idle(IDLE)
    }

    async fn entries(&self, stream: &str) -> Vec<HashMap<String, redis::Value>> {
        let r: StreamRangeReply = self.conn.clone().xrange_all(stream).await.unwrap();
        r.ids.into_iter().map(|e| e.map).collect()
    }

    async fn pending(&self) -> i64 {
        let v: redis::Value = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(GROUP)
            .query_async(&mut self.conn.clone())
            .await
            .unwrap();
        match v {
            redis::Value::Array(items) => match items.first() {
                Some(redis::Value::Int(n)) => *n,
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }

    async fn cleanup(self) {
        let _: () = self
            .conn
            .clone()
            .del(&[&self.stream, &dead_stream(&self.stream)])
            .await
            .unwrap();
    }
}

fn text(v: Option<&redis::Value>) -> String {
    match v {
        Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("not a string: {other:?}"),
    }
}

#[tokio::test]
async fn a_published_row_arrives_with_its_message_id_payload_and_headers() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = StreamPublisher::connect(&fx.client).await.unwrap();
    publisher
        .publish(&row(&fx.stream, "order-1"))
        .await
        .unwrap();
    let mut bad = row(&fx.stream, "order-bad");
    bad.headers.push(("payload".into(), "x".into()));
    let results = publisher
        .publish_all(&[row(&fx.stream, "order-2"), bad, row(&fx.stream, "order-3")])
        .await;
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    assert!(
        results[1].is_err(),
        "a header hiding the payload field is refused"
    );
    let entries = fx.entries(&fx.stream).await;
    let ids: Vec<_> = entries.iter().map(|e| text(e.get("message_id"))).collect();
    assert_eq!(ids, ["order-1", "order-2", "order-3"]);
    assert_eq!(text(entries[0].get("payload")), "payload of order-1");
    assert_eq!(text(entries[0].get("tenant")), "acme");
    fx.cleanup().await;
}

#[tokio::test]
async fn duplicates_published_on_purpose_are_acked_without_running_the_handler() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = StreamPublisher::connect(&fx.client).await.unwrap();
    let rows: Vec<_> = ["a", "b", "a", "a", "c"]
        .iter()
        .map(|id| row(&fx.stream, id))
        .collect();
    assert!(publisher.publish_all(&rows).await.iter().all(Result::is_ok));
    let (runs, calls) = (Runs::default(), Arc::new(AtomicU32::new(0)));
    let store = Arc::new(MemoryStore::new());
    let handler = counting(
        &store,
        InboxConfig::default(),
        &runs,
        &calls,
        Duration::ZERO,
    );
    let (stop, signal) = shutdown();
    let task = tokio::spawn(fx.consumer("w1", config()).run(handler, signal));
    wait_until("five settled", || calls.load(Ordering::SeqCst) == 5).await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_eq!((stats.processed, stats.duplicates), (3, 2), "{stats:?}");
    assert!(all_once(&runs, 3));
    assert_eq!(fx.pending().await, 0, "every entry acked");
    fx.cleanup().await;
}

#[tokio::test]
async fn a_worker_killed_before_its_ack_has_its_entry_reclaimed_and_absorbed() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = StreamPublisher::connect(&fx.client).await.unwrap();
    publisher
        .publish(&row(&fx.stream, "order-1"))
        .await
        .unwrap();
    let store = Arc::new(MemoryStore::new());
    let runs = Runs::default();
    let committed = Arc::new(AtomicU32::new(0));
    let a = fx.consumer("w-a", config()).run(
        commit_then_hang(&store, &runs, &committed),
        Shutdown::never(),
    );
    let task_a = tokio::spawn(a);
    wait_until("A committed", || committed.load(Ordering::SeqCst) == 1).await;
    task_a.abort();
    let _ = task_a.await;
    assert_eq!(fx.pending().await, 1, "A's entry stays pending");

    let calls = Arc::new(AtomicU32::new(0));
    let handler = counting(
        &store,
        InboxConfig::default(),
        &runs,
        &calls,
        Duration::ZERO,
    );
    let (stop, signal) = shutdown();
    let task_b = tokio::spawn(fx.consumer("w-b", config()).run(handler, signal));
    wait_until("B reclaimed it", || calls.load(Ordering::SeqCst) == 1).await;
    stop.shut_down();
    let stats = task_b.await.unwrap().unwrap();
    assert_eq!((stats.processed, stats.duplicates), (0, 1), "{stats:?}");
    assert!(all_once(&runs, 1));
    assert_eq!(fx.pending().await, 0);
    fx.cleanup().await;
}

#[tokio::test]
async fn entries_without_an_id_or_older_than_the_floor_are_dead_lettered_unhandled() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let mut conn = fx.conn.clone();
    // An entry id from one hour ago (ids only need to increase: the stream is new).
    let old_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        - 3_600_000;
    let _: String = conn
        .xadd(&fx.stream, format!("{old_ms}-0"), &[("message_id", "old")])
        .await
        .unwrap();
    let _: String = conn
        .xadd(&fx.stream, "*", &[("payload", "no id")])
        .await
        .unwrap();
    let (runs, calls) = (Runs::default(), Arc::new(AtomicU32::new(0)));
    let handler = counting(
        &Arc::new(MemoryStore::new()),
        InboxConfig::default(),
        &runs,
        &calls,
        Duration::ZERO,
    );
    let (stop, signal) = shutdown();
    let floor = ConsumerConfig {
        max_age: Some(Duration::from_secs(60)),
        ..config()
    };
    let task = tokio::spawn(fx.consumer("w1", floor).run(handler, signal));
    let dead = dead_stream(&fx.stream);
    let mut entries = Vec::new();
    for _ in 0..200 {
        entries = fx.entries(&dead).await;
        if entries.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(text(entries[0].get("message_id")), "old");
    assert!(text(entries[0].get(DEAD_LETTER_REASON)).contains("older than"));
    assert_eq!(text(entries[1].get(DEAD_LETTER_REASON)), "no message id");
    assert_eq!(text(entries[1].get("payload")), "no id");
    assert_eq!(stats.refused, 2, "{stats:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(fx.pending().await, 0);
    fx.cleanup().await;
}

#[tokio::test]
async fn a_poison_entry_reaches_the_dead_stream_after_max_attempts() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = StreamPublisher::connect(&fx.client).await.unwrap();
    publisher.publish(&row(&fx.stream, "poison")).await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let (stop, signal) = shutdown();
    let task = tokio::spawn(
        fx.consumer("w1", config())
            .run(poison(MemoryStore::new(), 3, &runs), signal),
    );
    let dead = dead_stream(&fx.stream);
    let mut entries = Vec::new();
    for _ in 0..200 {
        entries = fx.entries(&dead).await;
        if !entries.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(text(entries[0].get("message_id")), "poison");
    assert!(text(entries[0].get(DEAD_LETTER_REASON)).contains("attempts used up"));
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!((stats.errors, stats.dead_letters), (3, 1), "{stats:?}");
    assert_eq!(fx.pending().await, 0);
    fx.cleanup().await;
}

#[tokio::test]
async fn shutdown_with_entries_in_flight_loses_none() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = StreamPublisher::connect(&fx.client).await.unwrap();
    let rows: Vec<_> = (0..20)
        .map(|i| row(&fx.stream, &format!("m-{i}")))
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
    let task = tokio::spawn(fx.consumer("w1", config()).run(slow(), signal));
    wait_until("some ran", || runs.lock().unwrap().len() >= 2).await;
    stop.shut_down();
    let first = task.await.unwrap().unwrap();
    assert!(first.processed < 20, "{first:?}");
    assert_eq!(fx.pending().await, 0, "whatever it read, it settled");
    let (stop, signal) = shutdown();
    let task = tokio::spawn(fx.consumer("w2", config()).run(slow(), signal));
    wait_until("all ran", || runs.lock().unwrap().len() == 20).await;
    stop.shut_down();
    let second = task.await.unwrap().unwrap();
    assert_eq!(first.processed + second.processed, 20);
    assert!(all_once(&runs, 20));
    fx.cleanup().await;
}

#[tokio::test]
async fn with_one_in_flight_entries_run_one_at_a_time_in_stream_order() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = StreamPublisher::connect(&fx.client).await.unwrap();
    for id in ids(10) {
        publisher.publish(&row(&fx.stream, &id)).await.unwrap();
    }
    let (order, most) = (Arc::default(), Arc::new(AtomicU32::new(0)));
    let one = one_in_flight();
    let (stop, signal) = shutdown();
    let task = tokio::spawn(
        fx.consumer("w1", one)
            .run(one_at_a_time_probe(&order, &most), signal),
    );
    wait_until("all ran", || order.lock().unwrap().len() == 10).await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_one_at_a_time(&stats, &order, &most, 10);
    fx.cleanup().await;
}

#[tokio::test]
async fn a_transient_error_runs_again_inside_one_delivery_which_is_acked_once() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = StreamPublisher::connect(&fx.client).await.unwrap();
    publisher
        .publish(&row(&fx.stream, "parcel-1"))
        .await
        .unwrap();
    let store = Arc::new(MemoryStore::new());
    let log = Arc::default();
    let (stop, signal) = shutdown();
    let task = tokio::spawn(
        fx.consumer("w1", config())
            .run(transient_once(&store, &log), signal),
    );
    wait_until("the second run", || log.lock().unwrap().len() == 2).await;
    // Past `claim_idle`: an entry left pending would be reclaimed and run a third time.
    tokio::time::sleep(IDLE * 3).await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_retried_in_process(&stats, &log);
    assert_eq!(stats.settle_errors, 0, "{stats:?}");
    assert_eq!(fx.pending().await, 0, "XACKed: nothing pending");
    assert!(fx.entries(&dead_stream(&fx.stream)).await.is_empty());
    fx.cleanup().await;
}
