//! The Kafka publisher and consumer against a real Kafka-protocol broker
//! (`DEDUP_KAFKA_BROKERS`; the test servers run Tansu).

mod suite;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dedup_brokers::kafka::{
    DEFAULT_MESSAGE_TIMEOUT, KafkaConsumer, KafkaPublisher, MESSAGE_ID_HEADER,
};
use dedup_brokers::{ConsumerConfig, DEAD_LETTER_REASON, Delivery, Shutdown, shutdown, with_inbox};
use dedup_core::outbox::Publisher;
use dedup_core::{Inbox, InboxConfig, MemoryStore};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use suite::{BrokerFactory, DeadLetter, broker_suite};
use support::{Runs, all_once, config, counting, kafka, row, wait_until};

const TIMEOUT: Duration = Duration::from_secs(10);

struct Fixture {
    brokers: String,
    topic: String,
    dead: String,
    group: String,
}

/// A record as read back from a topic.
struct Record {
    headers: Vec<(String, String)>,
    payload: Vec<u8>,
}

impl Record {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Fixture {
    /// A fresh topic and dead-letter topic (one partition each) and a fresh group.
    async fn new() -> Option<Fixture> {
        let brokers = dedup_conformance::server_url("DEDUP_KAFKA_BROKERS")?;
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let fx = Fixture {
            brokers,
            topic: format!("dedup-{tag}"),
            dead: format!("dedup-{tag}-dead"),
            group: format!("dedup-{tag}-group"),
        };
        kafka::create_topics(&fx.brokers, &[&fx.topic, &fx.dead]).await;
        Some(fx)
    }

    fn client(&self) -> ClientConfig {
        kafka::client(&self.brokers)
    }

    /// A consumer of the topic in the fixture's group. A short session: Tansu completes a
    /// join after about half the session timeout (librdkafka's default, 45 s, would make
    /// each join take 22 s).
    fn consumer(&self, config: ConsumerConfig) -> KafkaConsumer {
        KafkaConsumer::new(&self.brokers, &self.group, &self.topic, &self.dead, config)
            .set("session.timeout.ms", "2000")
            .set("heartbeat.interval.ms", "300")
    }

    /// Every record of `topic` (partition 0) so far, read to the end (until no record
    /// comes for a second: Tansu's high watermark counts a batch of several records as
    /// one, so it cannot tell where the log ends).
    async fn records(&self, topic: &str) -> Vec<Record> {
        let (topic, brokers) = (topic.to_owned(), self.brokers.clone());
        tokio::task::spawn_blocking(move || {
            let consumer = kafka::reader(&brokers, "dedup-test-reader", &topic);
            let mut out = Vec::new();
            while let Some(m) = consumer.poll(Duration::from_secs(1)) {
                let m = m.unwrap();
                assert_eq!(m.offset(), out.len() as i64, "offsets of {topic} are dense");
                let headers = kafka::headers(&m);
                out.push(Record {
                    headers,
                    payload: m.payload().unwrap_or_default().to_vec(),
                });
            }
            out
        })
        .await
        .unwrap()
    }

    /// The group's committed offset of the topic's partition 0 (0 when none).
    async fn committed(&self) -> i64 {
        let (topic, mut client, group) = (self.topic.clone(), self.client(), self.group.clone());
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = client.set("group.id", &group).create().unwrap();
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&topic, 0);
            let committed = consumer.committed_offsets(tpl, TIMEOUT).unwrap();
            match committed.elements()[0].offset() {
                Offset::Offset(o) => o,
                _ => 0,
            }
        })
        .await
        .unwrap()
    }

    /// One past the topic's last record.
    async fn end(&self) -> i64 {
        self.records(&self.topic).await.len() as i64
    }

    async fn publish_raw(&self, payload: &[u8]) {
        let producer: FutureProducer = self.client().create().unwrap();
        producer
            .send(
                FutureRecord::<(), [u8]>::to(&self.topic).payload(payload),
                TIMEOUT,
            )
            .await
            .unwrap();
    }

    async fn cleanup(self) {
        let admin: AdminClient<DefaultClientContext> = self.client().create().unwrap();
        let _ = admin
            .delete_topics(&[&self.topic, &self.dead], &AdminOptions::new())
            .await;
    }
}

#[async_trait]
impl BrokerFactory for Fixture {
    type Source = KafkaConsumer;

    async fn new() -> Option<Self> {
        Fixture::new().await
    }

    async fn publish(&self, ids: &[String]) {
        let publisher = KafkaPublisher::new(&self.brokers).unwrap();
        for id in ids {
            publisher.publish(&row(&self.topic, id)).await.unwrap();
        }
    }

    async fn publish_without_id(&self, payload: &[u8]) {
        self.publish_raw(payload).await;
    }

    async fn source(&self, _worker: &str, config: &ConsumerConfig) -> KafkaConsumer {
        self.consumer(config.clone())
    }

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        self.records(&self.dead)
            .await
            .iter()
            .map(|r| DeadLetter {
                message_id: r.header(MESSAGE_ID_HEADER).map(str::to_owned),
                payload: r.payload.clone(),
                reason: r.header(DEAD_LETTER_REASON).map(str::to_owned),
                headers: r.headers.clone(),
            })
            .collect()
    }

    /// Records of the topic (retried copies included) past the group's committed offset.
    async fn outstanding(&self) -> u64 {
        let (end, committed) = (self.end().await, self.committed().await);
        assert!(committed <= end, "committed {committed} past the end {end}");
        (end - committed) as u64
    }

    async fn cleanup(self) {
        Fixture::cleanup(self).await
    }
}

broker_suite!(Fixture);

#[tokio::test]
async fn a_published_row_arrives_with_its_message_id_and_headers() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = KafkaPublisher::new(&fx.brokers).unwrap();
    publisher.publish(&row(&fx.topic, "order-1")).await.unwrap();
    let results = publisher
        .publish_all(&[row(&fx.topic, "order-2"), row(&fx.topic, "order-3")])
        .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let got = fx.records(&fx.topic).await;
    let ids: Vec<_> = got
        .iter()
        .map(|r| r.header(MESSAGE_ID_HEADER).unwrap())
        .collect();
    assert_eq!(ids, ["order-1", "order-2", "order-3"]);
    assert_eq!(got[0].header("tenant"), Some("acme"));
    assert_eq!(got[0].payload, b"payload of order-1");
    fx.cleanup().await;
}

#[tokio::test]
async fn a_publisher_without_a_reachable_broker_returns_an_error_never_ok() {
    let mut settings = ClientConfig::new();
    // Nothing listens on port 1; the delivery report comes back as a timeout.
    settings
        .set("bootstrap.servers", "127.0.0.1:1")
        .set("message.timeout.ms", "1500");
    let publisher = KafkaPublisher::from_config(&settings).unwrap();
    let result = publisher.publish(&row("dedup-nowhere", "order-1")).await;
    assert!(result.is_err(), "{result:?}");
}

/// Three records; the second one's handler hangs: the first and third settle, the
/// committed offset stays right after the first. The consumer is killed; a new member of
/// the group gets the second (and the third, answered by the inbox as a duplicate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offset_is_committed_only_past_settled_records() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    fx.publish(&["m-1", "m-2", "m-3"].map(String::from)).await;
    let store = Arc::new(MemoryStore::new());
    let runs = Runs::default();
    let hanging = {
        let runs = Arc::clone(&runs);
        with_inbox(
            Inbox::from_arc(Arc::clone(&store), InboxConfig::default()),
            move |_lease, d: Delivery| {
                let runs = Arc::clone(&runs);
                async move {
                    let id = d.message_id.unwrap();
                    if id == "m-2" {
                        std::future::pending::<()>().await;
                    }
                    *runs.lock().unwrap().entry(id).or_default() += 1;
                    Ok::<_, std::io::Error>(None)
                }
            },
        )
    };
    let a = tokio::spawn(fx.consumer(config()).run(hanging, Shutdown::never()));
    wait_until("m-1 and m-3 ran", || runs.lock().unwrap().len() == 2).await;
    // The commit of m-1 is asynchronous: give it a moment, then check it never passes m-2.
    for _ in 0..100 {
        if fx.committed().await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        fx.committed().await,
        1,
        "committed past m-1 only, not past the unsettled m-2"
    );
    a.abort();
    let _ = a.await;

    let calls = Arc::new(AtomicU32::new(0));
    let handler = counting(
        &store,
        InboxConfig::default(),
        &runs,
        &calls,
        Duration::ZERO,
    );
    let (stop, signal) = shutdown();
    let b = tokio::spawn(fx.consumer(config()).run(handler, signal));
    wait_until("B settled m-2 and m-3", || {
        calls.load(Ordering::SeqCst) == 2
    })
    .await;
    stop.shut_down();
    let stats = b.await.unwrap().unwrap();
    assert_eq!((stats.processed, stats.duplicates), (1, 1), "{stats:?}");
    assert!(all_once(&runs, 3), "each ran once: {runs:?}");
    assert_eq!(fx.committed().await, 3);
    fx.cleanup().await;
}

/// Without the header and with the fallback on, each record's id is its place in the log:
/// the same payload written twice (as a producer's retry would) is handled twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_header_the_fallback_keys_on_topic_partition_offset() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    fx.publish_raw(b"same").await;
    fx.publish_raw(b"same").await;
    let (runs, calls) = (Runs::default(), Arc::new(AtomicU32::new(0)));
    let handler = counting(
        &Arc::new(MemoryStore::new()),
        InboxConfig::default(),
        &runs,
        &calls,
        Duration::ZERO,
    );
    let (stop, signal) = shutdown();
    let task = tokio::spawn(
        fx.consumer(config())
            .fall_back_to_offset(true)
            .run(handler, signal),
    );
    wait_until("both ran", || calls.load(Ordering::SeqCst) == 2).await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_eq!((stats.processed, stats.refused), (2, 0), "{stats:?}");
    let mut ids: Vec<_> = runs.lock().unwrap().keys().cloned().collect();
    ids.sort();
    assert_eq!(
        ids,
        [format!("{}/0/0", fx.topic), format!("{}/0/1", fx.topic)]
    );
    assert_eq!(fx.outstanding().await, 0);
    fx.cleanup().await;
}

/// A's handler of m-2 is held while B joins the group: the partition is revoked from A
/// (which commits its settled prefix, past m-1) and assigned again. Whoever owns it then
/// gets m-2 (and m-3) again; once A's held handler finishes, every record ran once and the
/// group's offset reaches the end of the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_commits_what_is_settled_and_loses_nothing() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    fx.publish(&["m-1", "m-2", "m-3"].map(String::from)).await;
    let store = Arc::new(MemoryStore::new());
    let runs = Runs::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let held = {
        let (runs, gate) = (Arc::clone(&runs), Arc::clone(&gate));
        with_inbox(
            Inbox::from_arc(Arc::clone(&store), InboxConfig::default()),
            move |_lease, d: Delivery| {
                let (runs, gate) = (Arc::clone(&runs), Arc::clone(&gate));
                async move {
                    let id = d.message_id.unwrap();
                    if id == "m-2" {
                        let _ = gate.acquire().await.unwrap();
                    }
                    *runs.lock().unwrap().entry(id).or_default() += 1;
                    Ok::<_, std::io::Error>(None)
                }
            },
        )
    };
    let (stop, signal) = shutdown();
    let a = tokio::spawn(fx.consumer(config()).run(held, signal.clone()));
    wait_until("m-1 and m-3 ran in A", || runs.lock().unwrap().len() == 2).await;
    let calls = Arc::new(AtomicU32::new(0));
    let handler = counting(
        &store,
        InboxConfig::default(),
        &runs,
        &calls,
        Duration::ZERO,
    );
    let b = tokio::spawn(fx.consumer(config()).run(handler, signal));
    // B's join revokes A's partition; Tansu completes the join within about a second.
    tokio::time::sleep(Duration::from_secs(3)).await;
    gate.add_permits(1);
    wait_until("m-2 ran", || runs.lock().unwrap().len() == 3).await;
    for _ in 0..200 {
        if fx.outstanding().await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.shut_down();
    let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
    assert_eq!(a.processed + b.processed, 3, "{a:?} {b:?}");
    assert!(all_once(&runs, 3), "each ran once: {runs:?}");
    assert_eq!(
        fx.outstanding().await,
        0,
        "the group's offset is at the end"
    );
    fx.cleanup().await;
}

/// A dead-letter topic that does not exist: `run` refuses to start rather than lose dead
/// letters.
#[tokio::test]
async fn a_missing_dead_letter_topic_is_refused_at_start() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let consumer = KafkaConsumer::new(
        &fx.brokers,
        &fx.group,
        &fx.topic,
        format!("{}-missing", fx.dead),
        config(),
    );
    let calls = Arc::new(AtomicU32::new(0));
    let handler = counting(
        &Arc::new(MemoryStore::new()),
        InboxConfig::default(),
        &Runs::default(),
        &calls,
        Duration::ZERO,
    );
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        consumer.run(handler, Shutdown::never()),
    )
    .await
    .expect("run ends by itself");
    let err = result.expect_err("a missing dead-letter topic is refused");
    assert!(!err.is_retryable(), "{err:?}");
    assert!(format!("{err}").contains("-missing"), "{err}");
    fx.cleanup().await;
}

/// The admission floor reads the record's timestamp: a record older than `max_age` is
/// dead-lettered unhandled, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_older_than_the_floor_by_its_timestamp_is_dead_lettered_unhandled() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    fx.publish(&["old".to_string()]).await;
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
    let mut dead = Vec::new();
    for _ in 0..200 {
        dead = fx.dead_letters().await;
        if !dead.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].message_id.as_deref(), Some("old"));
    let reason = dead[0].reason.as_deref().unwrap();
    assert!(reason.starts_with("older than"), "{reason}");
    assert_eq!(stats.refused, 1, "{stats:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(fx.outstanding().await, 0);
    fx.cleanup().await;
}

/// `KafkaPublisher::new` (15 s message timeout, plus at most 5 s waiting for room in the
/// local queue) fits a relay's default 30 s hold; one keeping librdkafka's own default of
/// 300 s, or its alias `delivery.timeout.ms`, is refused by the relay.
#[tokio::test]
async fn a_relay_refuses_a_kafka_publisher_whose_message_timeout_outlasts_its_hold() {
    let Some(brokers) = dedup_conformance::server_url("DEDUP_KAFKA_BROKERS") else {
        return;
    };
    let default = KafkaPublisher::new(&brokers).unwrap();
    assert_eq!(default.message_timeout(), DEFAULT_MESSAGE_TIMEOUT);
    assert_eq!(default.delivery_timeout(), Duration::from_secs(20));
    let mut settings = ClientConfig::new();
    settings.set("bootstrap.servers", &brokers);
    let mut alias = settings.clone();
    alias.set("delivery.timeout.ms", "60000");
    let alias = KafkaPublisher::from_config(&alias).unwrap();
    assert_eq!(alias.message_timeout(), Duration::from_secs(60));
    settings.set("message.timeout.ms", "300000");
    let slow = KafkaPublisher::from_config(&settings).unwrap();
    support::relay_time::assert_relay_checks_timeout(
        Arc::new(default),
        Arc::new(slow),
        Duration::from_secs(305),
    )
    .await;
}
