//! RabbitMQ consumer with manual acks and prefetch, deduplicated with an `Inbox`.
//!
//! The run: a publisher sends five orders, one of them twice (a publisher retry: same
//! `message_id`). Consumer A, a separate OS process with prefetch 10, processes orders and
//! is killed (abort) right after committing order-3 and before acknowledging it; RabbitMQ
//! requeues everything A had not acknowledged, order-3 with the redelivered flag. Consumer B
//! then drains the queue: the redelivered order-3 is a duplicate (acknowledged without
//! charging), order-4 and order-5 are processed. Every order is charged exactly once.
//!
//! Needs a RabbitMQ server: `--amqp URL` or `DEDUP_AMQP_URL` (scripts/services.sh starts
//! one on loopback).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use dedup_core::{DedupStore, Handled, Inbox, InboxConfig, Key};
use dedup_examples::report::{print_json, print_table};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions,
    BasicQosOptions, BasicRejectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

/// RabbitMQ consumer killed before its ack; the redelivery is processed once.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// AMQP URL (default: $DEDUP_AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/%2f).
    #[arg(long)]
    amqp: Option<String>,
    /// Store URL (default: an SQLite file in a temporary folder).
    #[arg(long)]
    store: Option<String>,
    /// Internal: run as consumer A (the one that gets killed) on this queue.
    #[arg(long, hide = true)]
    doomed_consumer_of: Option<String>,
    /// Internal: the payment ledger (an SQLite file shared by both consumers).
    #[arg(long, hide = true)]
    ledger: Option<PathBuf>,
}

const ORDERS: [&str; 5] = ["order-1", "order-2", "order-3", "order-4", "order-5"];
const KILLED_AT: &str = "order-3";

#[derive(serde::Serialize, serde::Deserialize, Default)]
struct Tally {
    consumer: String,
    deliveries: u32,
    redelivered: u32,
    processed: u32,
    duplicates: u32,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dedup_examples::exit::report(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let amqp = args
        .amqp
        .clone()
        .or_else(|| std::env::var("DEDUP_AMQP_URL").ok())
        .unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    if let (Some(queue), Some(ledger), Some(store)) =
        (&args.doomed_consumer_of, &args.ledger, &args.store)
    {
        return consumer_a(&amqp, queue, store, ledger).await;
    }

    let tmp = tempfile::tempdir()?;
    let store_url = dedup_examples::url_or_temp_sqlite(args.store, tmp.path(), "inbox.db");
    let ledger = tmp.path().join("ledger.db");
    Ledger::create(&ledger)?;
    let conn = Connection::connect(&amqp, ConnectionProperties::default()).await?;
    let channel = conn.create_channel().await?;
    let queue = format!(
        "dedup-orders-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;

    // Publisher: five orders, order-2 twice (a retry after a lost publisher confirm).
    let mut published = 0;
    for id in ORDERS.iter().chain(&["order-2"]) {
        let props = BasicProperties::default().with_message_id((*id).into());
        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                id.as_bytes(),
                props,
            )
            .await?
            .await?;
        published += 1;
    }

    // Consumer A: a separate process, killed before acking order-3.
    let status = std::process::Command::new(std::env::current_exe()?)
        .args([
            "--amqp",
            &amqp,
            "--store",
            &store_url,
            "--doomed-consumer-of",
            &queue,
        ])
        .arg("--ledger")
        .arg(&ledger)
        .status()?;
    let killed = !status.success();

    // Consumer B: drain the queue (everything A had not acked is back).
    let store = dedup::open(&store_url).await?;
    let inbox = inbox(store);
    let mut b = Tally {
        consumer: "B".into(),
        ..Tally::default()
    };
    let mut empty_polls = 0;
    while empty_polls < 3 {
        match channel
            .basic_get(queue.as_str().into(), BasicGetOptions::default())
            .await?
        {
            None => {
                empty_polls += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Some(msg) => {
                empty_polls = 0;
                let d = msg.delivery;
                b.deliveries += 1;
                b.redelivered += u32::from(d.redelivered);
                let id = message_id(&d.properties)?;
                match handle(&inbox, &ledger, &id).await? {
                    Handled::Processed { .. } => b.processed += 1,
                    Handled::Duplicate { .. } => b.duplicates += 1,
                    Handled::Busy { .. } => {
                        d.acker
                            .nack(BasicNackOptions {
                                requeue: true,
                                ..Default::default()
                            })
                            .await?;
                        continue;
                    }
                    // Settled for good without processing (this inbox sets no attempt limit
                    // and stores no failures, so it never happens here): reject without
                    // requeue, which routes it to the queue's dead-letter exchange if any.
                    Handled::Failed { .. } | Handled::DeadLetter { .. } => {
                        d.acker
                            .reject(BasicRejectOptions { requeue: false })
                            .await?;
                        continue;
                    }
                }
                d.acker.ack(BasicAckOptions::default()).await?;
            }
        }
    }
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await?;
    let charges = Ledger::charges(&ledger)?;

    let a = Tally {
        consumer: "A (killed)".into(),
        ..serde_json::from_str(&std::fs::read_to_string(ledger.with_extension("a.json"))?)?
    };
    let rows: Vec<Vec<String>> = [&a, &b]
        .iter()
        .map(|t| {
            vec![
                t.consumer.clone(),
                t.deliveries.to_string(),
                t.redelivered.to_string(),
                t.processed.to_string(),
                t.duplicates.to_string(),
            ]
        })
        .collect();
    println!(
        "published {published} messages ({} orders, one published twice)",
        ORDERS.len()
    );
    println!("consumer A killed before acking {KILLED_AT}: {killed}\n");
    print_table(
        &[
            "consumer",
            "deliveries",
            "redelivered",
            "processed",
            "duplicates acked",
        ],
        &rows,
    );
    let doubled = charges.iter().filter(|(_, n)| *n > 1).count();
    let lost = ORDERS
        .iter()
        .filter(|o| !charges.iter().any(|(c, _)| c == *o))
        .count();
    println!(
        "\ncharges: {} for {} orders; doubled {doubled}, lost {lost}",
        charges.iter().map(|(_, n)| n).sum::<i64>(),
        ORDERS.len()
    );
    print_json(&serde_json::json!({
        "published": published,
        "killed_before_ack": killed,
        "a": a,
        "b": b,
        "charges": charges.iter().map(|(_, n)| n).sum::<i64>(),
        "doubled": doubled,
        "lost": lost,
    }));
    Ok(())
}

fn inbox(store: Arc<dyn DedupStore>) -> Inbox<dyn DedupStore> {
    Inbox::from_arc(
        store,
        InboxConfig {
            lease: Duration::from_secs(10),
            ..InboxConfig::default()
        },
    )
}

fn message_id(props: &BasicProperties) -> Result<String, Box<dyn std::error::Error>> {
    Ok(props
        .message_id()
        .as_ref()
        .ok_or("message without message_id")?
        .as_str()
        .to_string())
}

/// Charge the order once: the handler under the inbox.
async fn handle(
    inbox: &Inbox<dyn DedupStore>,
    ledger: &Path,
    id: &str,
) -> Result<Handled, Box<dyn std::error::Error>> {
    let key = Key::new("billing", id)?;
    let ledger = ledger.to_path_buf();
    let order = id.to_string();
    Ok(inbox
        .handle(&key, None, |_lease| async move {
            Ledger::charge(&ledger, &order)?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Some(b"charged".to_vec()))
        })
        .await
        .map_err(|e| e.to_string())?)
}

/// Consumer A: prefetch 10, manual acks; aborts (as a `kill -9` would) right after the
/// commit of order-3, before its ack.
async fn consumer_a(
    amqp: &str,
    queue: &str,
    store_url: &str,
    ledger: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let conn = Connection::connect(amqp, ConnectionProperties::default()).await?;
    let channel: Channel = conn.create_channel().await?;
    channel.basic_qos(10, BasicQosOptions::default()).await?;
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "consumer-a".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let inbox = inbox(dedup::open(store_url).await?);
    let mut tally = Tally::default();
    while let Some(delivery) = consumer.next().await {
        let d = delivery?;
        tally.deliveries += 1;
        let id = message_id(&d.properties)?;
        match handle(&inbox, ledger, &id).await? {
            Handled::Processed { .. } => tally.processed += 1,
            Handled::Duplicate { .. } => tally.duplicates += 1,
            Handled::Busy { .. } | Handled::Failed { .. } | Handled::DeadLetter { .. } => {}
        }
        if id == KILLED_AT {
            std::fs::write(
                ledger.with_extension("a.json"),
                serde_json::to_string(&tally)?,
            )?;
            std::process::abort(); // killed after the commit, before the ack
        }
        d.acker.ack(BasicAckOptions::default()).await?;
    }
    Err("queue closed before consumer A reached order-3".into())
}

/// The payment provider's ledger: one row per charge, in an SQLite file both processes share.
struct Ledger;

impl Ledger {
    fn open(path: &Path) -> dedup_sqlite::rusqlite::Result<dedup_sqlite::rusqlite::Connection> {
        let conn = dedup_sqlite::rusqlite::Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(10))?;
        Ok(conn)
    }

    fn create(path: &Path) -> dedup_sqlite::rusqlite::Result<()> {
        Self::open(path)?.execute_batch("CREATE TABLE charges (order_id TEXT NOT NULL)")
    }

    fn charge(path: &Path, order: &str) -> dedup_sqlite::rusqlite::Result<()> {
        Self::open(path)?
            .execute("INSERT INTO charges VALUES (?1)", [order])
            .map(drop)
    }

    fn charges(path: &Path) -> dedup_sqlite::rusqlite::Result<Vec<(String, i64)>> {
        let conn = Self::open(path)?;
        let mut stmt = conn.prepare("SELECT order_id, count(*) FROM charges GROUP BY order_id")?;
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect()
    }
}
