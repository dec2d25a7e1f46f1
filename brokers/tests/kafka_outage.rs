//! Kafka unreachable, and restarted, on a private broker.
//!
//! The README's Kafka publisher (`KafkaPublisher::new`) and a relay with its default
//! configuration through a 60 s outage of the broker: every row reaches the topic exactly
//! once, counted by message id.
//!
//! The broker is a private Tansu (`services.sh start kafka`) behind a TCP proxy of this
//! test, whose port the broker advertises (`DEDUP_KAFKA_ADVERTISED_PORT`), so every client
//! connection goes through the proxy. The test cuts the proxy for 60 s: it closes every
//! connection through it, and closes new ones as soon as it takes them.
//!
//! Not a black hole (connections kept, nothing forwarded): produce requests in flight then
//! time out, librdkafka bumps the idempotent producer's epoch, and Tansu 0.6.0 answered
//! every later produce of that producer with `PRODUCER_FENCED` (seen here: nothing was
//! published in the 60 s after the outage). Kafka itself takes the bump (KIP-360).
//!
//! And a crash-restart (`services.sh crash-restart kafka`, S3 storage) keeps the topic, its
//! records and a group's committed offset.

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_brokers::kafka::{KafkaPublisher, MESSAGE_ID_HEADER};
use dedup_core::outbox::{MemoryOutbox, OutboxMessage, Publisher, Relay};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use support::kafka;
use support::private::Private;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How long the broker is unreachable: twice the relay's hold.
const OUTAGE: Duration = Duration::from_secs(60);
/// Rows written to the outbox once the broker is unreachable.
const ROWS: usize = 300;

/// A TCP proxy to one upstream address that can be cut (see the module docs).
struct Proxy {
    cut: watch::Sender<bool>,
}

impl Proxy {
    /// Forward what `listener` accepts to `upstream` until dropped.
    fn start(listener: TcpListener, upstream: SocketAddr) -> Proxy {
        let (cut, watching) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(serve(client, upstream, watching.clone()));
            }
        });
        Proxy { cut }
    }

    /// Cut (`true`) or heal (`false`).
    fn cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

/// One client connection: forwarded until a cut, then closed (at once while cut).
async fn serve(mut client: TcpStream, upstream: SocketAddr, mut cut: watch::Receiver<bool>) {
    if *cut.borrow_and_update() {
        return;
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = cut.wait_for(|cut| *cut) => {}
    }
}

/// How many records of `topic` (partition 0) carry each message id: read until `expected`
/// records came and then none for 2 s (Tansu's high watermark cannot tell where the log
/// ends), at most 60 s.
async fn copies_by_id(brokers: &str, topic: &str, expected: usize) -> HashMap<String, u32> {
    let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let consumer = kafka::reader(&brokers, "dedup-outage-reader", &topic);
        let (mut copies, mut records) = (HashMap::new(), 0);
        let started = Instant::now();
        let mut quiet_since = Instant::now();
        while started.elapsed() < Duration::from_secs(60)
            && (records < expected || quiet_since.elapsed() < Duration::from_secs(2))
        {
            let Some(m) = consumer.poll(Duration::from_millis(200)) else {
                continue;
            };
            let m = m.unwrap();
            quiet_since = Instant::now();
            records += 1;
            let id = m
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == MESSAGE_ID_HEADER))
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default();
            *copies.entry(id).or_insert(0) += 1;
        }
        copies
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_defaults_a_60_s_outage_puts_every_row_on_the_topic_once() {
    // The private broker needs the servers' binaries, which the shared ones show are there.
    if dedup_conformance::server_url("DEDUP_KAFKA_BROKERS").is_none() {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let kafka = tokio::task::spawn_blocking(move || {
        let port = port.to_string();
        Private::start_own(
            "kafka",
            "DEDUP_KAFKA_BROKERS",
            &[("DEDUP_KAFKA_ADVERTISED_PORT", &port)],
        )
    })
    .await
    .unwrap();
    let proxy = Proxy::start(listener, kafka.url.parse().unwrap());
    let brokers = format!("127.0.0.1:{port}");
    let topic = format!("outage-{}", uuid::Uuid::new_v4().simple());
    kafka::create_topics(&brokers, &[&topic]).await;

    // The README's publisher and relay, with their defaults.
    let publisher = Arc::new(KafkaPublisher::new(&brokers).unwrap());
    publisher
        .publish(&support::row(&topic, "warm-up"))
        .await
        .expect("the broker takes a record before the outage");
    let outbox = MemoryOutbox::new();
    let relay = Relay::new(Arc::new(outbox.clone()), publisher)
        .start()
        .expect("the default publisher fits the default hold");

    proxy.cut(true);
    let ids: Vec<String> = (0..ROWS).map(|i| format!("outage-{i}")).collect();
    let messages: Vec<OutboxMessage> = ids
        .iter()
        .map(|id| OutboxMessage::new(&topic, id, id.as_bytes().to_vec()).unwrap())
        .collect();
    outbox.enqueue(&messages).unwrap();
    tokio::time::sleep(OUTAGE).await;
    assert_eq!(relay.sent(), 0, "nothing was confirmed through the cut");
    proxy.cut(false);

    let healed = Instant::now();
    while relay.sent() < ROWS as u64 && healed.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sent_after = healed.elapsed();
    let all = relay.stop().await;
    assert_eq!(all.sent, ROWS as u64, "every row sent within 60 s: {all:?}");
    assert_eq!(all.dead, 0, "{all:?}");
    eprintln!("all {ROWS} rows sent {sent_after:?} after the outage; the relay: {all:?}");

    let copies = copies_by_id(&brokers, &topic, ROWS + 1).await;
    let doubled: Vec<_> = copies.iter().filter(|(_, n)| **n > 1).collect();
    let records: u32 = copies.values().sum();
    assert!(
        doubled.is_empty(),
        "{records} records for {} ids; {} ids more than once, e.g. {:?}",
        copies.len(),
        doubled.len(),
        &doubled[..doubled.len().min(5)]
    );
    for id in ids.iter().chain([&"warm-up".to_owned()]) {
        assert_eq!(copies.get(id), Some(&1), "{id} on the topic once");
    }
    drop(kafka);
}

/// `services.sh crash-restart kafka` on a Kafka started with `DEDUP_KAFKA_STORAGE=s3`:
/// Tansu SIGKILLed and started again keeps the topic, its records and the group's
/// committed offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_restarted_kafka_keeps_its_topics_records_and_group_offsets() {
    if dedup_conformance::server_url("DEDUP_KAFKA_BROKERS").is_none() {
        return;
    }
    let kafka = tokio::task::spawn_blocking(|| {
        Private::start_own(
            "kafka",
            "DEDUP_KAFKA_BROKERS",
            &[("DEDUP_KAFKA_STORAGE", "s3")],
        )
    })
    .await
    .unwrap();
    let brokers = kafka.url.clone();
    let topic = format!("kept-{}", uuid::Uuid::new_v4().simple());
    kafka::create_topics(&brokers, &[&topic]).await;
    let publisher = KafkaPublisher::new(&brokers).unwrap();
    for id in ["kept-1", "kept-2", "kept-3"] {
        publisher.publish(&support::row(&topic, id)).await.unwrap();
    }
    let group = format!("{topic}-group");
    let committed = |brokers: String, topic: String, commit: Option<i64>| {
        let mut config = kafka::client(&brokers);
        config.set("group.id", &group);
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = config.create().unwrap();
            if let Some(offset) = commit {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition_offset(&topic, 0, Offset::Offset(offset))
                    .unwrap();
                consumer
                    .commit(&tpl, rdkafka::consumer::CommitMode::Sync)
                    .unwrap();
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&topic, 0);
            let read = consumer
                .committed_offsets(tpl, Duration::from_secs(10))
                .unwrap();
            read.find_partition(&topic, 0).unwrap().offset()
        })
    };
    let before = committed(brokers.clone(), topic.clone(), Some(2))
        .await
        .unwrap();
    assert_eq!(before, Offset::Offset(2));
    drop(publisher);

    let started = Instant::now();
    let kafka = tokio::task::spawn_blocking(move || {
        kafka.crash_restart("kafka");
        kafka
    })
    .await
    .unwrap();
    eprintln!("crash-restarted in {:?}", started.elapsed());
    let after = committed(brokers.clone(), topic.clone(), None)
        .await
        .unwrap();
    assert_eq!(after, Offset::Offset(2), "the group's offset survives");
    let copies = copies_by_id(&brokers, &topic, 3).await;
    for id in ["kept-1", "kept-2", "kept-3"] {
        assert_eq!(copies.get(id), Some(&1), "{id} kept: {copies:?}");
    }
    drop(kafka);
}
