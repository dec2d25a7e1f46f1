//! The Redis Streams publisher and consumer against the real Redis (`DEDUP_REDIS_URL`).

mod suite;
mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dedup_brokers::redis_streams::{StreamConsumer, StreamPublisher, dead_stream};
use dedup_brokers::{ConsumerConfig, DEAD_LETTER_REASON, shutdown};
use dedup_core::outbox::Publisher;
use dedup_core::{InboxConfig, MemoryStore};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redis::streams::StreamInfoGroupsReply;
use redis::streams::StreamRangeReply;
use suite::broken::{
    AcksBeforeHandling, DropsFailureHeaders, DropsMessageId, FetchesPastTheBound, must_fail,
};
use suite::{BrokerFactory, DeadLetter, broker_suite, clauses};
use support::{Runs, assert_retried_in_process, config, counting, row, transient_once, wait_until};

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

#[async_trait]
impl BrokerFactory for Fixture {
    type Source = StreamConsumer;

    async fn new() -> Option<Self> {
        Fixture::new().await
    }

    async fn publish(&self, ids: &[String]) {
        let publisher = StreamPublisher::connect(&self.client).await.unwrap();
        let rows: Vec<_> = ids.iter().map(|id| row(&self.stream, id)).collect();
        let results = publisher.publish_all(&rows).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }

    async fn publish_without_id(&self, payload: &[u8]) {
        let _: String = self
            .conn
            .clone()
            .xadd(&self.stream, "*", &[("payload", payload)])
            .await
            .unwrap();
    }

    async fn source(&self, worker: &str, config: &ConsumerConfig) -> StreamConsumer {
        self.consumer(worker, config.clone())
    }

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        let maybe = |v: Option<&redis::Value>| v.map(|v| text(Some(v)));
        self.entries(&dead_stream(&self.stream))
            .await
            .into_iter()
            .map(|e| DeadLetter {
                message_id: maybe(e.get("message_id")),
                payload: maybe(e.get("payload")).unwrap_or_default().into_bytes(),
                reason: maybe(e.get(DEAD_LETTER_REASON)),
                headers: e.iter().map(|(n, v)| (n.clone(), text(Some(v)))).collect(),
            })
            .collect()
    }

    /// Pending in the group, plus entries after its last delivered id (all of them when no
    /// consumer made the group yet).
    async fn outstanding(&self) -> u64 {
        let mut conn = self.conn.clone();
        let groups: StreamInfoGroupsReply = conn.xinfo_groups(&self.stream).await.unwrap();
        let Some(group) = groups.groups.into_iter().find(|g| g.name == GROUP) else {
            let n: u64 = conn.xlen(&self.stream).await.unwrap();
            return n;
        };
        let unread: StreamRangeReply = conn
            .xrange(&self.stream, format!("({}", group.last_delivered_id), "+")
            .await
            .unwrap();
        (group.pending + unread.ids.len()) as u64
    }

    async fn cleanup(self) {
        Fixture::cleanup(self).await
    }
}

broker_suite!(Fixture);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_catches_an_adapter_that_acks_before_the_handler_ran() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let clause = clauses::a_retry_comes_back_after_its_delay(AcksBeforeHandling(fx));
    must_fail("an adapter acking before its handler ran", clause).await;
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let clause =
        clauses::a_consumer_killed_mid_handler_has_its_redelivery_absorbed(AcksBeforeHandling(fx));
    must_fail("an adapter acking before its handler ran", clause).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_catches_an_adapter_that_drops_the_message_id() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let clause = clauses::same_id_published_n_times_is_handled_once(DropsMessageId(fx));
    must_fail("an adapter dropping the message id", clause).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_catches_an_adapter_that_drops_the_failure_headers() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let clause = clauses::a_dead_lettered_copy_carries_its_cause(DropsFailureHeaders(fx));
    must_fail("an adapter dropping the failure headers", clause).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_keeps_the_in_flight_bound_when_a_source_fetches_past_it() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    clauses::the_in_flight_bound_is_never_exceeded(FetchesPastTheBound(fx)).await;
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
async fn an_entry_older_than_the_floor_by_its_id_is_dead_lettered_unhandled() {
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
        if !entries.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(text(entries[0].get("message_id")), "old");
    assert!(text(entries[0].get(DEAD_LETTER_REASON)).contains("older than"));
    assert_eq!(stats.refused, 1, "{stats:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(fx.pending().await, 0);
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

/// A publisher's publish timeout (10 s by default) fits a relay's default 30 s hold; a
/// 60 s one is refused by the relay.
#[tokio::test]
async fn a_relay_refuses_a_redis_streams_publisher_whose_publish_timeout_outlasts_its_hold() {
    let Some(url) = dedup_conformance::server_url("DEDUP_REDIS_URL") else {
        return;
    };
    let client = redis::Client::open(url).unwrap();
    let default = StreamPublisher::connect(&client).await.unwrap();
    let slow = default.clone().publish_timeout(Duration::from_secs(60));
    support::relay_time::assert_relay_checks_timeout(
        Arc::new(default),
        Arc::new(slow),
        Duration::from_secs(60),
    )
    .await;
}
