//! RabbitMQ consumer with manual acks and prefetch, deduplicated with an `Inbox`.
//!
//! A publisher sends five orders, order-2 twice (a publisher retry: same `message_id`).
//! Consumer A, prefetch 1, dies right after committing order-3 and before acknowledging
//! it: its connection drops. RabbitMQ requeues order-3, redelivered. Consumer B drains the
//! queue: order-3 is a duplicate (acknowledged, not charged), order-4 and order-5 are
//! processed. Both are `dedup-brokers`' `RabbitConsumer` with `with_inbox`: it takes each
//! key from the AMQP `message_id`, acks processed messages and duplicates.
//!
//! Needs a RabbitMQ server: `--amqp URL` or `DEDUP_AMQP_URL` (scripts/services.sh starts
//! one on loopback).

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use dedup_brokers::rabbitmq::RabbitConsumer;
use dedup_brokers::shutdown;
use dedup_examples::orders::{self, Charges, SENT, Tally};
use dedup_examples::report::print_json;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::{BasicProperties, Connection, ConnectionProperties, types::FieldTable};

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
}

const KILLED_AT: &str = "order-3";
/// Consumer B stops once no delivery came for this long.
const IDLE: Duration = Duration::from_millis(300);
/// How long the program waits for each consumer's part.
const PART: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dedup_examples::exit::report(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let amqp = args.amqp.or_else(|| std::env::var("DEDUP_AMQP_URL").ok());
    let amqp = amqp.unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let tmp = tempfile::tempdir()?;
    let url = dedup_examples::url_or_temp_sqlite(args.store, tmp.path(), "inbox.db");
    let store = dedup::open(&url).await?;
    let connect = || Connection::connect(&amqp, ConnectionProperties::default());
    let conn = connect().await?;
    let channel = conn.create_channel().await?;
    let queue = format!("orders-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (declare, table) = (QueueDeclareOptions::default(), FieldTable::default());
    channel
        .queue_declare(queue.as_str().into(), declare, table)
        .await?;
    for id in SENT {
        let props = BasicProperties::default().with_message_id(id.into());
        let options = BasicPublishOptions::default();
        let body = id.as_bytes();
        channel
            .basic_publish("".into(), queue.as_str().into(), options, body, props)
            .await?
            .await?;
    }
    let charges = Charges::default();

    // Consumer A: prefetch 1 (with more it would take orders past order-3 first). After the
    // inbox committed order-3 it hangs; then its task and its connection drop unacked.
    let a = Tally::shared("A (killed)");
    let conn_a = connect().await?;
    let counted = orders::billing(Arc::clone(&store), Arc::new(charges.clone()), &a);
    let dying = orders::dying_after(counted, Some(KILLED_AT));
    let consumer_a = RabbitConsumer::new(conn_a.create_channel().await?, &queue, orders::config(1));
    let worker_a = tokio::spawn(consumer_a.run(dying, shutdown().1));
    orders::stop_when(&a, PART, |t| t.has_seen(KILLED_AT))
        .wait()
        .await;
    worker_a.abort();
    let _ = worker_a.await;
    let killed = orders::lock(&a).has_seen(KILLED_AT);
    // A is gone: RabbitMQ requeues what it had not acked once its connection closes. The
    // close races the aborted consumer's own channel close, and an error from it says
    // nothing about A (seen once: "invalid channel state: Closing"); dropping the last
    // handle closes the connection in any case.
    let _ = conn_a.close(0, "killed before its ack".into()).await;
    drop(conn_a);

    // Consumer B: drains the queue (what A had not acked is back).
    let b = Tally::shared("B");
    let idle = |t: &Tally| t.last.is_some_and(|l| l.elapsed() > IDLE);
    let stopped = orders::stop_when(&b, PART, idle);
    let counted = orders::billing(store, Arc::new(charges.clone()), &b);
    let consumer_b = RabbitConsumer::new(conn.create_channel().await?, &queue, orders::config(10));
    consumer_b.run(counted, stopped).await?;
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await?;

    let (a, b) = (orders::take(&a), orders::take(&b));
    orders::print_tallies(&[&a, &b]);
    let (total, doubled, lost) = orders::count(&orders::lock(&charges));
    println!(
        "\npublished {} messages; A killed before acking {KILLED_AT}: {killed}",
        SENT.len()
    );
    println!("charges: {total} for 5 orders; doubled {doubled}, lost {lost}");
    print_json(&serde_json::json!({
        "published": SENT.len(), "killed_before_ack": killed, "a": a, "b": b,
        "charges": total, "doubled": doubled, "lost": lost,
    }));
    Ok(())
}
