//! Replay from a Kafka dead-letter topic against the real Kafka (`DEDUP_KAFKA_BROKERS`;
//! the test servers run Tansu): each copy goes back to its topic and partition with its
//! key, runs once, and is marked settled.

mod replay_suite;
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use dedup_brokers::ConsumerConfig;
use dedup_brokers::kafka::{
    KafkaConsumer, KafkaDeadLetters, KafkaPublisher, MESSAGE_ID_HEADER, SETTLED_HEADER,
};
use dedup_brokers::replay::{self, DeadLetters, Pick};
use dedup_core::outbox::Publisher;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use replay_suite::{ReplayBroker, World, replay_scenarios, strings};
use support::{kafka, row};

/// Partitions of the consumed topic: enough that two keys land apart.
const PARTITIONS: i32 = 3;

struct Fixture {
    brokers: String,
    topic: String,
    dead: String,
    group: String,
}

/// One record read back.
#[derive(Debug)]
struct Record {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    message_id: Option<String>,
    headers: Vec<(String, String)>,
}

impl Fixture {
    /// Every record of `topic`, all partitions, each in offset order (read until none comes
    /// for a second: Tansu's high watermark cannot tell where the log ends).
    async fn records(&self, topic: &str) -> Vec<Record> {
        let (topic, brokers) = (topic.to_owned(), self.brokers.clone());
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = kafka::client(&brokers)
                .set("group.id", "dedup-test-reader")
                .set("enable.auto.commit", "false")
                .create()
                .unwrap();
            let mut tpl = TopicPartitionList::new();
            for p in 0..PARTITIONS {
                tpl.add_partition_offset(&topic, p, Offset::Beginning)
                    .unwrap();
            }
            consumer.assign(&tpl).unwrap();
            let mut out = Vec::new();
            while let Some(m) = consumer.poll(Duration::from_secs(1)) {
                let m = m.unwrap();
                let headers = kafka::headers(&m);
                out.push(Record {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    message_id: headers
                        .iter()
                        .find(|(n, _)| n == MESSAGE_ID_HEADER)
                        .map(|(_, v)| v.clone()),
                    headers,
                });
            }
            out
        })
        .await
        .unwrap()
    }

    fn session(&self) -> KafkaDeadLetters {
        KafkaDeadLetters::new(&kafka::client(&self.brokers), &self.dead).unwrap()
    }
}

#[async_trait]
impl ReplayBroker for Fixture {
    type Source = KafkaConsumer;
    type Letters = KafkaDeadLetters;

    async fn new() -> Option<Self> {
        let brokers = dedup_conformance::server_url("DEDUP_KAFKA_BROKERS")?;
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let fx = Fixture {
            brokers,
            topic: format!("dedup-replay-{tag}"),
            dead: format!("dedup-replay-{tag}-dead"),
            group: format!("dedup-replay-{tag}-group"),
        };
        kafka::create_partitioned(&fx.brokers, &[&fx.topic, &fx.dead], PARTITIONS).await;
        Some(fx)
    }

    fn consumer(&self) -> String {
        self.group.clone()
    }

    /// Each id with its record key ([`key_of`]).
    async fn publish(&self, ids: &[String]) {
        let publisher = KafkaPublisher::new(&self.brokers).unwrap();
        for id in ids {
            let mut row = row(&self.topic, id);
            row.ordering_key = Some(key_of(id));
            publisher.publish(&row).await.unwrap();
        }
    }

    /// A short session: Tansu completes a join after about half the session timeout.
    async fn source(&self, config: &ConsumerConfig) -> KafkaConsumer {
        KafkaConsumer::new(
            &self.brokers,
            &self.group,
            &self.topic,
            &self.dead,
            config.clone(),
        )
        .set("session.timeout.ms", "2000")
        .set("heartbeat.interval.ms", "300")
    }

    async fn dead_letters(&self) -> KafkaDeadLetters {
        self.session()
    }

    async fn cleanup(self) {
        let admin: AdminClient<DefaultClientContext> =
            kafka::client(&self.brokers).create().unwrap();
        let _ = admin
            .delete_topics(&[&self.topic, &self.dead], &AdminOptions::new())
            .await;
    }
}

/// The record key of a message id: `bad-a1` → `a`, `bad-b2` → `b` (its letter), else the
/// id itself.
fn key_of(id: &str) -> String {
    match id.strip_prefix("bad-") {
        Some(rest) if rest.len() == 2 => rest[..1].to_owned(),
        _ => id.to_owned(),
    }
}

replay_scenarios!(Fixture);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_records_land_on_their_key_partition_in_order() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let ids = ["bad-a1", "bad-b1", "bad-a2", "bad-c1", "bad-a3", "bad-b2"];
    let w = World::start(fx).await;
    w.dead_letter(&strings(&ids)).await;
    let originals = w.fx.records(&w.fx.topic).await;
    let partition_of: BTreeMap<String, i32> = originals
        .iter()
        .map(|r| (r.message_id.clone().unwrap(), r.partition))
        .collect();
    // The order the dead letters hold, per key: the order a replay keeps.
    let mut dead_order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in w.fx.records(&w.fx.dead).await {
        let id = r.message_id.unwrap();
        dead_order.entry(key_of(&id)).or_default().push(id);
    }
    let mut seen: BTreeMap<i32, i64> = BTreeMap::new();
    for r in &originals {
        seen.insert(
            r.partition,
            r.offset.max(seen.get(&r.partition).copied().unwrap_or(-1)),
        );
    }

    let report = w.replay(&Pick::All).await;
    assert_eq!(report.replayed.len(), ids.len(), "{report:?}");
    let runs = w.runs_after(&strings(&ids)).await;
    assert!(runs.values().all(|&n| n == 1), "{runs:?}");

    let after = w.fx.records(&w.fx.topic).await;
    let replayed = after
        .into_iter()
        .filter(|r| seen.get(&r.partition).is_none_or(|&last| r.offset > last));
    let mut replayed_order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in replayed {
        let id = r.message_id.clone().unwrap();
        assert_eq!(r.partition, partition_of[&id], "{id} left its partition");
        assert_eq!(r.key.as_deref(), Some(key_of(&id).as_bytes()), "{id}'s key");
        let own = r.headers.iter().map(|(n, _)| n.as_str());
        let kept: Vec<&str> = own.collect();
        assert!(kept.contains(&"tenant"), "{id}: {kept:?}");
        assert!(
            kept.iter()
                .all(|n| !replay::is_dead_letter_header(n) && !n.starts_with("x-dedup-")),
            "{id}: {kept:?}"
        );
        replayed_order.entry(key_of(&id)).or_default().push(id);
    }
    assert_eq!(
        replayed_order, dead_order,
        "each key's records in the dead letters' order"
    );
    w.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_copy_is_marked_and_skipped_by_the_next_session() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let w = World::start(fx).await;
    w.dead_letter(&strings(&["bad-m", "bad-n"])).await;
    let report = w.replay(&Pick::Ids(["bad-m".to_owned()].into())).await;
    assert_eq!(report.replayed, ["bad-m"]);
    let dead = w.fx.records(&w.fx.dead).await;
    let copy_of_m = dead
        .iter()
        .position(|r| r.message_id.as_deref() == Some("bad-m"))
        .unwrap();
    let markers: Vec<&Record> = dead
        .iter()
        .filter(|r| r.headers.iter().any(|(n, _)| n == SETTLED_HEADER))
        .collect();
    assert_eq!(markers.len(), 1, "{dead:?}");
    assert_eq!(markers[0].partition, dead[copy_of_m].partition);
    assert!(markers[0].message_id.is_none());
    let mut session = w.fx.session();
    let left = session.take(100).await.unwrap();
    let ids: Vec<_> = left.iter().filter_map(|l| l.message_id.clone()).collect();
    assert_eq!(ids, ["bad-n"], "the marked copy and the marker are skipped");
    assert!(session.take(100).await.unwrap().is_empty());
    // Before the topics go: librdkafka crashes on Tansu's metadata of a deleted topic.
    drop(session);
    w.finish().await;
}

#[tokio::test]
async fn open_reads_the_brokers_and_topic_from_the_url() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let url = format!("kafka://{}?topic={}", fx.brokers, fx.dead);
    let mut dead = replay::open(&url).await.unwrap();
    assert_eq!(dead.describe(), format!("Kafka topic {:?}", fx.dead));
    assert!(dead.take(10).await.unwrap().is_empty());
    let missing = replay::open(&format!("kafka://{}", fx.brokers)).await;
    let missing = missing.err().unwrap();
    assert!(missing.to_string().contains("?topic="), "{missing}");
    drop(dead);
    fx.cleanup().await;
}
