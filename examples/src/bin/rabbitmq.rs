//! RabbitMQ consumer with manual acks and prefetch, deduplicated with an `Inbox`.
//!
//! The run: a publisher sends five orders, one of them twice (a publisher retry: same
//! `message_id`). Consumer A, a separate OS process with prefetch 1, processes orders and
//! is killed (abort) right after committing order-3 and before acknowledging it; RabbitMQ
//! requeues everything A had not acknowledged, order-3 with the redelivered flag. Consumer B
//! then drains the queue: the redelivered order-3 is a duplicate (acknowledged without
//! charging), order-4 and order-5 are processed. Every order is charged exactly once.
//!
//! Both consumers are `dedup-brokers`' `RabbitConsumer` running `with_inbox`: the adapter
//! takes each key from the AMQP `message_id`, acks processed messages and duplicates, and
//! requeues a busy one; this program only counts what its handler saw.
//!
//! Needs a RabbitMQ server: `--amqp URL` or `DEDUP_AMQP_URL` (scripts/services.sh starts
//! one on loopback).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use dedup_brokers::rabbitmq::RabbitConsumer;
use dedup_brokers::{ConsumerConfig, Delivery, Handle, Shutdown, shutdown, with_inbox};
use dedup_core::{BoxError, DedupStore, Handled, Inbox, InboxConfig, InboxError, Key};
use dedup_examples::report::{print_json, print_table};
use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};

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

    // Consumer B: drain the queue (everything A had not acked is back), stopping once no
    // delivery came for IDLE.
    let store = dedup::open(&store_url).await?;
    let tally = Arc::new(Mutex::new(Tally {
        consumer: "B".into(),
        ..Tally::default()
    }));
    let last = Arc::new(Mutex::new(Instant::now()));
    let handler = counting(
        charging(store, &ledger),
        Arc::clone(&tally),
        Arc::clone(&last),
    );
    let (stop, stopped) = shutdown();
    let idle = tokio::spawn(async move {
        while lock(&last).elapsed() < IDLE {
            tokio::time::sleep(IDLE / 3).await;
        }
        stop.shut_down();
    });
    consumer(conn.create_channel().await?, &queue, 10)
        .run(handler, stopped)
        .await?;
    idle.await?;
    let b = std::mem::take(&mut *lock(&tally));
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

/// How long consumer B waits for another delivery before it stops.
const IDLE: Duration = Duration::from_millis(300);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A consumer of `queue` with `prefetch` in flight, keys under the consumer name `billing`.
fn consumer(channel: lapin::Channel, queue: &str, prefetch: usize) -> RabbitConsumer {
    RabbitConsumer::new(
        channel,
        queue,
        ConsumerConfig {
            consumer: Some("billing".into()),
            in_flight: prefetch,
            ..ConsumerConfig::default()
        },
    )
}

/// Charge the order once: the ledger write under the inbox (lease mode).
fn charging(store: Arc<dyn DedupStore>, ledger: &Path) -> Arc<dyn Handle> {
    let inbox = Inbox::from_arc(
        store,
        InboxConfig {
            lease: Duration::from_secs(10),
            ..InboxConfig::default()
        },
    );
    let ledger = ledger.to_path_buf();
    Arc::new(with_inbox(inbox, move |_lease, delivery: Delivery| {
        let ledger = ledger.clone();
        async move {
            let order = delivery.message_id.unwrap_or_default();
            Ledger::charge(&ledger, &order)?;
            Ok::<_, BoxError>(Some(b"charged".to_vec()))
        }
    }))
}

/// `inner`, counting into `tally` what it was given and answered, and stamping `last`.
fn counting(
    inner: Arc<dyn Handle>,
    tally: Arc<Mutex<Tally>>,
    last: Arc<Mutex<Instant>>,
) -> impl Handle {
    move |key: Key, delivery: Delivery| {
        let (inner, tally, last) = (Arc::clone(&inner), Arc::clone(&tally), Arc::clone(&last));
        async move {
            let handled = inner.handle(&key, &delivery).await;
            let mut t = lock(&tally);
            t.deliveries += 1;
            t.redelivered += u32::from(delivery.redelivered);
            match &handled {
                Ok(Handled::Processed { .. }) => t.processed += 1,
                Ok(Handled::Duplicate { .. }) => t.duplicates += 1,
                _ => {}
            }
            *lock(&last) = Instant::now();
            handled
        }
    }
}

/// Consumer A: prefetch 1 (the adapter runs as many handlers at once as its prefetch, so
/// with more A would handle orders past order-3 before it dies); aborts (as a `kill -9`
/// would) right after the inbox committed order-3, before the adapter acks it.
async fn consumer_a(
    amqp: &str,
    queue: &str,
    store_url: &str,
    ledger: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let conn = Connection::connect(amqp, ConnectionProperties::default()).await?;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let counted: Arc<dyn Handle> = Arc::new(counting(
        charging(dedup::open(store_url).await?, ledger),
        Arc::clone(&tally),
        Arc::new(Mutex::new(Instant::now())),
    ));
    let ledger = ledger.to_path_buf();
    let handler = move |key: Key, delivery: Delivery| {
        let (counted, tally, ledger) = (Arc::clone(&counted), Arc::clone(&tally), ledger.clone());
        async move {
            let handled: Result<Handled, InboxError> = counted.handle(&key, &delivery).await;
            if delivery.message_id.as_deref() == Some(KILLED_AT) {
                let json = serde_json::to_string(&*lock(&tally)).unwrap_or_default();
                let _ = std::fs::write(ledger.with_extension("a.json"), json);
                std::process::abort(); // killed after the commit, before the ack
            }
            handled
        }
    };
    consumer(conn.create_channel().await?, queue, 1)
        .run(handler, Shutdown::never())
        .await?;
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
