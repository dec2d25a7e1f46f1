//! Kafka consumer group, deduplicated with an `Inbox`.
//!
//! Five orders go to a one-partition topic, order-2 twice (two records, one `message-id`).
//! Consumer A of group `billing`, one record in flight, dies right after the inbox
//! committed order-3 and before the record settled. Consumer B gets the partition from the
//! committed offset: order-3 again (a duplicate, not charged), then order-4 and order-5.
//! Both are `dedup-brokers`' `KafkaConsumer` with `with_inbox`: it commits an offset only
//! past settled records.
//!
//! Needs a Kafka-protocol broker: `--kafka BROKERS` or `DEDUP_KAFKA_BROKERS`
//! (`scripts/services.sh start kafka` starts Tansu on loopback).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use clap::Parser;
use dedup_brokers::kafka::{KafkaConsumer, KafkaPublisher};
use dedup_brokers::shutdown;
use dedup_core::outbox::{OutboxRow, Publisher};
use dedup_core::{BoxError, Timestamp};
use dedup_examples::orders::{self, Charges, ORDERS, SENT, Tally};
use dedup_examples::report::print_json;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Kafka consumer killed before its record settled; the redelivery is processed once.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Bootstrap servers (default: $DEDUP_KAFKA_BROKERS, else 127.0.0.1:9092).
    #[arg(long)]
    kafka: Option<String>,
    /// Store URL (default: an SQLite file in a temporary folder).
    #[arg(long)]
    store: Option<String>,
}

const KILLED_AT: &str = "order-3";
/// How long the program waits for each consumer's part.
const PART: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dedup_examples::exit::report(run().await.map_err(|e| e as Box<dyn std::error::Error>))
}

async fn run() -> Result<(), BoxError> {
    let Args { kafka, store } = Args::parse();
    let kafka = kafka.or_else(|| std::env::var("DEDUP_KAFKA_BROKERS").ok());
    let kafka = kafka.unwrap_or_else(|| "127.0.0.1:9092".into());
    let tmp = tempfile::tempdir()?;
    let url = dedup_examples::url_or_temp_sqlite(store, tmp.path(), "inbox.db");
    let store = dedup::open(&url).await?;
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let (topic, dead, group) = (
        format!("orders-{tag}"),
        format!("orders-{tag}-dead"),
        format!("billing-{tag}"),
    );
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &kafka)
        .create()?;
    let new = [&topic, &dead].map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(1)));
    for created in admin.create_topics(&new, &AdminOptions::new()).await? {
        created.map_err(|(topic, code)| format!("creating topic {topic}: {code}"))?;
    }
    // Publisher: five orders, order-2 twice in a row.
    let rows: Vec<OutboxRow> = SENT.iter().map(|id| order(&topic, id)).collect();
    for published in KafkaPublisher::new(&kafka)?.publish_all(&rows).await {
        published?;
    }
    let charges = Charges::default();
    // A short session: a member that left is replaced sooner.
    let consumer = |in_flight| {
        KafkaConsumer::new(&kafka, &group, &topic, &dead, orders::config(in_flight))
            .set("session.timeout.ms", "2000")
            .set("heartbeat.interval.ms", "300")
    };

    // Consumer A: after the inbox committed order-3 it hangs, and its task is aborted
    // (the process as good as dead before the record settled).
    let a = Tally::shared("A (killed)");
    let counted = orders::billing(Arc::clone(&store), Arc::new(charges.clone()), &a);
    let worker_a =
        tokio::spawn(consumer(1).run(orders::dying_after(counted, Some(KILLED_AT)), shutdown().1));
    orders::stop_when(&a, PART, |t| t.has_seen(KILLED_AT))
        .wait()
        .await;
    worker_a.abort();
    let _ = worker_a.await; // dropped: it leaves the group

    // Consumer B: stops once it was given the last record.
    let b = Tally::shared("B");
    let stopped = orders::stop_when(&b, PART, |t| t.has_seen(ORDERS[4]));
    let counted = orders::billing(store, Arc::new(charges.clone()), &b);
    consumer(4).run(counted, stopped).await?;
    let committed = committed_offset(&kafka, &group, &topic).await?;

    let (a, b) = (orders::take(&a), orders::take(&b));
    orders::print_tallies(&[&a, &b]);
    let (total, doubled, lost) = orders::count(&orders::lock(&charges));
    println!(
        "\n{} records (order-2 twice); A killed after committing {KILLED_AT}",
        SENT.len()
    );
    println!(
        "charges: {total} for 5 orders; doubled {doubled}, lost {lost}; offset committed: {committed}"
    );
    print_json(&serde_json::json!({
        "records": SENT.len(), "a": a, "a_last": a.seen.last(), "b_first": b.seen.first(), "b": b,
        "charges": total, "doubled": doubled, "lost": lost, "committed": committed,
    }));
    Ok(())
}

/// One order as an outbox row (the message id is the order's).
fn order(topic: &str, id: &str) -> OutboxRow {
    let written_at = Timestamp::from_system_time(SystemTime::now());
    let (destination, message_id, payload) = (topic.into(), id.into(), id.as_bytes().to_vec());
    OutboxRow {
        id: 0,
        destination,
        message_id,
        headers: Vec::new(),
        payload,
        ordering_key: None,
        written_at,
        attempts: 1,
    }
}

/// The group's committed offset of the topic's partition 0 (0 when none).
async fn committed_offset(brokers: &str, group: &str, topic: &str) -> Result<i64, BoxError> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()?;
    let mut partitions = TopicPartitionList::new();
    partitions.add_partition(topic, 0);
    let committed = tokio::task::spawn_blocking(move || {
        consumer.committed_offsets(partitions, Duration::from_secs(10))
    })
    .await??;
    Ok(match committed.elements().first().map(|e| e.offset()) {
        Some(Offset::Offset(o)) => o,
        _ => 0,
    })
}
