//! The Kafka rows: a topic (one partition), its dead-letter topic and a consumer group per
//! run. The hand-written loop is rdkafka's `StreamConsumer` in the same group setup,
//! committing each message's offset asynchronously after its work.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use dedup_core::outbox::{OutboxRow, Publisher};
use dedup_core::{Inbox, MemoryStore, Timestamp};
use futures::FutureExt;
use futures::future::BoxFuture;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::harness::{
    Broker, Kind, PAYLOAD, Workers, adapter_run, admit, at_millis, config, handle_once,
};
use crate::bench::driver::Run;
use crate::bench::{Names, Result};
use dedup_brokers::kafka::{KafkaConsumer, KafkaPublisher, MESSAGE_ID_HEADER};

/// Kafka: a topic and consumer group per run.
pub(super) struct Kafka {
    brokers: String,
    publisher: Arc<KafkaPublisher>,
    run: String,
}

impl Kafka {
    pub(super) async fn connect(brokers: &str, names: &Names) -> Result<Self> {
        Ok(Kafka {
            brokers: brokers.to_owned(),
            publisher: Arc::new(KafkaPublisher::new(brokers)?),
            run: names.run.clone(),
        })
    }
}

/// The group settings both consumers share: a short session (Tansu completes a join after
/// about half of it), the earliest offset for a new group.
const SESSION: [(&str, &str); 2] = [
    ("session.timeout.ms", "2000"),
    ("heartbeat.interval.ms", "300"),
];

/// The inbox consumer name of the hand-written loop.
const CONSUMER: &str = "bench";

fn admin(brokers: &str) -> Result<AdminClient<DefaultClientContext>> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?)
}

impl Broker for Kafka {
    fn consume(
        &self,
        kind: Kind,
        tag: String,
        n: usize,
        in_flight: usize,
    ) -> BoxFuture<'static, Result<Run>> {
        let (brokers, publisher) = (self.brokers.clone(), Arc::clone(&self.publisher));
        let topic = format!("dedup-bench-{}-{tag}", self.run);
        async move {
            let dead = format!("{topic}-dead");
            let group = format!("{topic}-group");
            let admin = admin(&brokers)?;
            let new = [&topic, &dead].map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(1)));
            for created in admin.create_topics(&new, &AdminOptions::new()).await? {
                created.map_err(|(t, code)| format!("creating topic {t}: {code}"))?;
            }
            let run = async {
                let rows: Vec<OutboxRow> = (0..n)
                    .map(|k| OutboxRow {
                        id: 0,
                        destination: topic.clone(),
                        message_id: format!("{tag}-{k}"),
                        headers: vec![("type".into(), "OrderPlaced".into())],
                        payload: PAYLOAD.to_vec(),
                        ordering_key: None,
                        written_at: Timestamp::from_system_time(SystemTime::now()),
                        attempts: 1,
                    })
                    .collect();
                for chunk in rows.chunks(500) {
                    for published in publisher.publish_all(chunk).await {
                        published?;
                    }
                }
                match kind {
                    Kind::Adapter => {
                        let mut consumer =
                            KafkaConsumer::new(&brokers, &group, &topic, &dead, config(in_flight));
                        for (key, value) in SESSION {
                            consumer = consumer.set(key, value);
                        }
                        adapter_run(n, |handler, stopped| async move {
                            consumer.run(handler, stopped).await?;
                            Ok(())
                        })
                        .await
                    }
                    Kind::Raw | Kind::InboxLoop => {
                        raw(&brokers, &group, &topic, kind, n, in_flight).await
                    }
                }
            }
            .await;
            admin
                .delete_topics(&[&topic, &dead], &AdminOptions::new())
                .await?;
            run
        }
        .boxed()
    }

    fn setup(&self) -> String {
        "Kafka: a one-partition topic and consumer group per run (manual commits, session \
         2 s); the adapter commits past its settled prefix, the hand-written rdkafka loop \
         commits each message's offset (async) after its work"
            .into()
    }
}

async fn raw(
    brokers: &str,
    group: &str,
    topic: &str,
    kind: Kind,
    n: usize,
    in_flight: usize,
) -> Result<Run> {
    let inbox = Arc::new(Inbox::new(MemoryStore::new()));
    let mut workers = Workers::new(in_flight);
    let started = Instant::now();
    let mut settings = ClientConfig::new();
    settings
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest");
    for (key, value) in SESSION {
        settings.set(key, value);
    }
    let consumer: Arc<StreamConsumer> = Arc::new(settings.create()?);
    consumer.subscribe(&[topic])?;
    let mut seen = 0;
    while seen < n {
        let mut slots = workers.free().await?;
        while let Some(slot) = slots.pop() {
            if seen == n {
                break;
            }
            let message = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
                .await
                .map_err(|_| "no message for 60 s")??;
            let id = message.headers().and_then(|h| {
                h.iter()
                    .find(|h| h.key == MESSAGE_ID_HEADER)
                    .and_then(|h| h.value)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            });
            let (partition, offset) = (message.partition(), message.offset());
            let published = message
                .timestamp()
                .to_millis()
                .and_then(|ms| u64::try_from(ms).ok());
            let (inbox, consumer, topic) =
                (Arc::clone(&inbox), Arc::clone(&consumer), topic.to_owned());
            workers
                .run(slot, async move {
                    if kind == Kind::InboxLoop {
                        // The adapter's admission floor: the record's timestamp.
                        admit(published.map(at_millis))?;
                        handle_once(&inbox, CONSUMER, id.as_deref()).await?;
                    }
                    let mut done = TopicPartitionList::new();
                    done.add_partition_offset(&topic, partition, Offset::Offset(offset + 1))?;
                    consumer.commit(&done, CommitMode::Async)?;
                    Ok(())
                })
                .await?;
            seen += 1;
        }
    }
    workers.finish().await?;
    Ok(Run {
        elapsed: started.elapsed(),
        samples: Vec::new(),
    })
}
