//! Kafka consumer group, deduplicated with an `Inbox`.
//!
//! The run: a publisher (the idempotent producer, `acks=all`) writes five orders to a
//! one-partition topic, order-2 twice (the application sent it again: two records, one
//! `message-id`). Consumer A of group `billing`, one record in flight, processes orders and
//! dies (its task aborted) right after the inbox committed order-3 and before the record
//! settled: its group commits stop at the settled prefix, before order-3. Consumer B joins
//! the group and gets the partition from the committed offset: order-3 again (a duplicate,
//! settled without charging), then order-4 and order-5. Every order is charged exactly
//! once, the second order-2 record is a duplicate, and the group's committed offset ends
//! past the last record.
//!
//! Both consumers are `dedup-brokers`' `KafkaConsumer` running `with_inbox`: the adapter
//! takes each key from the `message-id` header, commits a partition's offset only past its
//! settled records, and on a rebalance commits what is settled before giving partitions up;
//! this program only counts what its handler saw.
//!
//! Needs a Kafka-protocol broker: `--kafka BROKERS` or `DEDUP_KAFKA_BROKERS`
//! (`scripts/services.sh start kafka` starts Tansu on loopback).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use clap::Parser;
use dedup_brokers::kafka::{KafkaConsumer, KafkaPublisher};
use dedup_brokers::{ConsumerConfig, Delivery, Handle, shutdown, with_inbox};
use dedup_core::outbox::{OutboxRow, Publisher};
use dedup_core::{BoxError, DedupStore, Handled, Inbox, InboxConfig, InboxError, Key, Timestamp};
use dedup_examples::report::{print_json, print_table};
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

const GROUP: &str = "billing";
const ORDERS: [&str; 5] = ["order-1", "order-2", "order-3", "order-4", "order-5"];
const KILLED_AT: &str = "order-3";
/// How long the program waits for each consumer's part.
const PART: Duration = Duration::from_secs(60);

#[derive(serde::Serialize, Default)]
struct Tally {
    consumer: &'static str,
    deliveries: u32,
    processed: u32,
    duplicates: u32,
    /// The message ids it was given, in order.
    #[serde(skip)]
    seen: Vec<String>,
}

type Charges = Arc<Mutex<HashMap<String, u32>>>;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dedup_examples::exit::report(run().await.map_err(|e| e as Box<dyn std::error::Error>))
}

async fn run() -> Result<(), BoxError> {
    let args = Args::parse();
    let brokers = args
        .kafka
        .or_else(|| std::env::var("DEDUP_KAFKA_BROKERS").ok())
        .unwrap_or_else(|| "127.0.0.1:9092".into());
    let tmp = tempfile::tempdir()?;
    let store_url = dedup_examples::url_or_temp_sqlite(args.store, tmp.path(), "inbox.db");
    let store = dedup::open(&store_url).await?;
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let (topic, dead) = (
        format!("dedup-orders-{tag}"),
        format!("dedup-orders-{tag}-dead"),
    );
    let group = format!("{GROUP}-{tag}");
    create_topics(&brokers, &[&topic, &dead]).await?;

    // Publisher: five orders, order-2 twice in a row.
    let publisher = KafkaPublisher::new(&brokers)?;
    let sent: Vec<&str> = ORDERS
        .iter()
        .flat_map(|o| {
            if *o == "order-2" {
                vec![*o, *o]
            } else {
                vec![*o]
            }
        })
        .collect();
    let rows: Vec<OutboxRow> = sent.iter().map(|id| order(&topic, id)).collect();
    for result in publisher.publish_all(&rows).await {
        result?;
    }
    let charges: Charges = Arc::default();

    // Consumer A: one record in flight; after the inbox committed order-3 the handler hangs,
    // and the task is aborted (the process as good as dead before the record settled).
    let a = Arc::new(Mutex::new(Tally {
        consumer: "A (killed)",
        ..Tally::default()
    }));
    let (reached, mut reached_kill) = tokio::sync::watch::channel(false);
    let worker_a = {
        let counted = counting(charging(Arc::clone(&store), &charges), Arc::clone(&a));
        let handler = move |key: Key, delivery: Delivery| {
            let (counted, reached) = (Arc::clone(&counted), reached.clone());
            async move {
                let handled = counted.handle(&key, &delivery).await;
                if delivery.message_id.as_deref() == Some(KILLED_AT) {
                    reached.send_replace(true);
                    return std::future::pending::<Result<Handled, InboxError>>().await;
                }
                handled
            }
        };
        let consumer = consumer(&brokers, &group, &topic, &dead, 1);
        tokio::spawn(async move { consumer.run(handler, shutdown().1).await })
    };
    tokio::time::timeout(PART, reached_kill.wait_for(|r| *r)).await??;
    worker_a.abort();
    let _ = worker_a.await; // dropped: it leaves the group

    // Consumer B: stops once it was given the last record.
    let b = Arc::new(Mutex::new(Tally {
        consumer: "B",
        ..Tally::default()
    }));
    let counted = counting(charging(store, &charges), Arc::clone(&b));
    let (stop, stopped) = shutdown();
    let (given, mut given_last) = tokio::sync::watch::channel(HashSet::<String>::new());
    let handler = move |key: Key, delivery: Delivery| {
        let (counted, given) = (Arc::clone(&counted), given.clone());
        async move {
            let handled = counted.handle(&key, &delivery).await;
            given.send_modify(|ids| {
                ids.insert(delivery.message_id.clone().unwrap_or_default());
            });
            handled
        }
    };
    let watcher = tokio::spawn(async move {
        let last = ORDERS[ORDERS.len() - 1];
        let _ = tokio::time::timeout(PART, given_last.wait_for(|ids| ids.contains(last))).await;
        stop.shut_down();
    });
    consumer(&brokers, &group, &topic, &dead, 4)
        .run(handler, stopped)
        .await?;
    watcher.await?;
    let committed = committed_offset(&brokers, &group, &topic).await?;

    let (a, b) = (take(&a), take(&b));
    print_table(
        &["consumer", "deliveries", "processed", "duplicates"],
        &[&a, &b]
            .iter()
            .map(|t| {
                vec![
                    t.consumer.to_string(),
                    t.deliveries.to_string(),
                    t.processed.to_string(),
                    t.duplicates.to_string(),
                ]
            })
            .collect::<Vec<_>>(),
    );
    let charges = charges.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let total: u32 = charges.values().sum();
    let doubled = charges.values().filter(|n| **n > 1).count();
    let lost = ORDERS.iter().filter(|o| !charges.contains_key(**o)).count();
    println!(
        "\n{} records ({} orders, order-2 twice); A killed after committing {KILLED_AT}",
        sent.len(),
        ORDERS.len()
    );
    println!(
        "charges: {total} for {} orders; doubled {doubled}, lost {lost}; group offset committed: {committed}",
        ORDERS.len()
    );
    print_json(&serde_json::json!({
        "records": sent.len(),
        "a": a,
        "a_last": a.seen.last(),
        "b_first": b.seen.first(),
        "b": b,
        "charges": total,
        "doubled": doubled,
        "lost": lost,
        "committed": committed,
    }));
    Ok(())
}

/// One order as an outbox row (the message id is the order's).
fn order(topic: &str, id: &str) -> OutboxRow {
    OutboxRow {
        id: 0,
        destination: topic.into(),
        message_id: id.into(),
        headers: Vec::new(),
        payload: id.as_bytes().to_vec(),
        ordering_key: None,
        written_at: Timestamp::from_system_time(SystemTime::now()),
        attempts: 1,
    }
}

/// `topics`, one partition each.
async fn create_topics(brokers: &str, topics: &[&str]) -> Result<(), BoxError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let new: Vec<_> = topics
        .iter()
        .map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(1)))
        .collect();
    for result in admin.create_topics(&new, &AdminOptions::new()).await? {
        result.map_err(|(topic, code)| format!("creating topic {topic}: {code}"))?;
    }
    Ok(())
}

/// A consumer of `topic` in `group`, `in_flight` records at most, keys under `billing`.
/// A short session: a member that left is replaced sooner.
fn consumer(
    brokers: &str,
    group: &str,
    topic: &str,
    dead: &str,
    in_flight: usize,
) -> KafkaConsumer {
    let config = ConsumerConfig {
        consumer: Some(GROUP.into()),
        in_flight,
        ..ConsumerConfig::default()
    };
    KafkaConsumer::new(brokers, group, topic, dead, config)
        .set("session.timeout.ms", "2000")
        .set("heartbeat.interval.ms", "300")
}

/// The group's committed offset of the topic's partition 0 (0 when none).
async fn committed_offset(brokers: &str, group: &str, topic: &str) -> Result<i64, BoxError> {
    let (brokers, group, topic) = (brokers.to_owned(), group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", &group)
            .create()?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&topic, 0);
        let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
        Ok(match committed.elements().first().map(|e| e.offset()) {
            Some(Offset::Offset(o)) => o,
            _ => 0,
        })
    })
    .await?
}

fn take(tally: &Mutex<Tally>) -> Tally {
    std::mem::take(&mut *tally.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Charge the order once: the charge under the inbox (lease mode).
fn charging(store: Arc<dyn DedupStore>, charges: &Charges) -> Arc<dyn Handle> {
    let inbox = Inbox::from_arc(
        store,
        InboxConfig {
            lease: Duration::from_secs(10),
            ..InboxConfig::default()
        },
    );
    let charges = Arc::clone(charges);
    Arc::new(with_inbox(inbox, move |_lease, delivery: Delivery| {
        let charges = Arc::clone(&charges);
        async move {
            let order = delivery.message_id.unwrap_or_default();
            *charges
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(order)
                .or_default() += 1;
            Ok::<_, BoxError>(Some(b"charged".to_vec()))
        }
    }))
}

/// `inner`, counting into `tally` what it was given and answered.
fn counting(inner: Arc<dyn Handle>, tally: Arc<Mutex<Tally>>) -> Arc<dyn Handle> {
    Arc::new(move |key: Key, delivery: Delivery| {
        let (inner, tally) = (Arc::clone(&inner), Arc::clone(&tally));
        async move {
            let handled = inner.handle(&key, &delivery).await;
            let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
            t.deliveries += 1;
            t.seen.push(delivery.message_id.clone().unwrap_or_default());
            match &handled {
                Ok(Handled::Processed { .. }) => t.processed += 1,
                Ok(Handled::Duplicate { .. }) => t.duplicates += 1,
                _ => {}
            }
            handled
        }
    })
}
