//! Redis Streams consumer group, deduplicated with an `Inbox`.
//!
//! The run: five orders are added to a stream, order-2 twice (a producer retry). Worker 1
//! reads a batch of four entries, processes and commits them, and dies before its batched
//! `XACK`: the entries stay pending for worker 1. Worker 2 reclaims the dead worker's
//! pending entries with `XAUTOCLAIM` once they have been idle long enough: each reclaimed
//! entry is a duplicate (acknowledged without charging). Worker 2 then reads the new
//! entries and processes them. Every order is charged exactly once and nothing stays pending.
//!
//! Needs a Redis server: `--redis URL` or `DEDUP_REDIS_URL`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use dedup_core::{DedupStore, Handled, Inbox, InboxConfig, Key};
use dedup_examples::report::{print_json, print_table};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamReadOptions, StreamReadReply,
};

/// Redis Streams: a dead consumer's pending entries reclaimed and processed once.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Redis URL for the stream (default: $DEDUP_REDIS_URL, else redis://127.0.0.1:6379/).
    #[arg(long)]
    redis: Option<String>,
    /// Store URL (default: an SQLite file in a temporary folder).
    #[arg(long)]
    store: Option<String>,
}

const GROUP: &str = "billing";
const MIN_IDLE: Duration = Duration::from_millis(200);

#[derive(serde::Serialize, Default)]
struct Tally {
    worker: &'static str,
    read: u32,
    reclaimed: u32,
    processed: u32,
    duplicates: u32,
    acked: u32,
}

type Charges = Arc<Mutex<HashMap<String, u32>>>;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dedup_examples::exit::report(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let url = args
        .redis
        .or_else(|| std::env::var("DEDUP_REDIS_URL").ok())
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".into());
    let tmp = tempfile::tempdir()?;
    let store_url = dedup_examples::url_or_temp_sqlite(args.store, tmp.path(), "inbox.db");
    let inbox = Inbox::from_arc(
        dedup::open(&store_url).await?,
        InboxConfig {
            lease: Duration::from_secs(10),
            ..InboxConfig::default()
        },
    );
    let mut redis = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let stream = format!(
        "dedup-orders-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let _: () = redis::cmd("XGROUP")
        .arg(&["CREATE", &stream, GROUP, "$", "MKSTREAM"])
        .query_async(&mut redis)
        .await?;
    let orders = [
        "order-1", "order-2", "order-2", "order-3", "order-4", "order-5",
    ];
    for order in orders {
        let _: String = redis.xadd(&stream, "*", &[("message_id", order)]).await?;
    }
    let charges: Charges = Arc::default();

    // Worker 1: reads four entries, processes them, dies before its batched XACK.
    let mut w1 = Tally {
        worker: "worker-1 (died before XACK)",
        ..Tally::default()
    };
    let batch = read_new(&mut redis, &stream, "worker-1", 4).await?;
    w1.read = batch.len() as u32;
    for entry in &batch {
        match handle(&inbox, &charges, entry).await? {
            Handled::Processed { .. } => w1.processed += 1,
            _ => w1.duplicates += 1,
        }
    }
    // ... the process dies here: no XACK.

    // Worker 2: reclaims what has been pending long enough, then reads new entries.
    tokio::time::sleep(MIN_IDLE + Duration::from_millis(50)).await;
    let mut w2 = Tally {
        worker: "worker-2",
        ..Tally::default()
    };
    let reclaimed: StreamAutoClaimReply = redis
        .xautoclaim_options(
            &stream,
            GROUP,
            "worker-2",
            MIN_IDLE.as_millis() as u64,
            "0-0",
            StreamAutoClaimOptions::default().count(100),
        )
        .await?;
    w2.reclaimed = reclaimed.claimed.len() as u32;
    let fresh = read_new(&mut redis, &stream, "worker-2", 100).await?;
    w2.read = fresh.len() as u32;
    for entry in reclaimed.claimed.iter().chain(&fresh) {
        match handle(&inbox, &charges, entry).await? {
            Handled::Processed { .. } => w2.processed += 1,
            Handled::Duplicate { .. } => w2.duplicates += 1,
            Handled::Busy { .. } => continue, // leave it pending: reclaimed later
            // Settled for good without processing (no attempt limit or stored failures are
            // configured here): acknowledge, as a real consumer would after copying the
            // entry to its dead-letter stream.
            Handled::Failed { .. } | Handled::DeadLetter { .. } => {}
        }
        let n: u32 = redis.xack(&stream, GROUP, &[&entry.id]).await?;
        w2.acked += n;
    }
    let pending: redis::Value = redis::cmd("XPENDING")
        .arg(&stream)
        .arg(GROUP)
        .query_async(&mut redis)
        .await?;
    let pending_count = match pending {
        redis::Value::Array(ref items) => match items.first() {
            Some(redis::Value::Int(n)) => *n,
            _ => -1,
        },
        _ => -1,
    };
    let _: () = redis.del(&stream).await?;

    print_table(
        &[
            "worker",
            "read",
            "reclaimed",
            "processed",
            "duplicates",
            "acked",
        ],
        &[&w1, &w2]
            .iter()
            .map(|t| {
                vec![
                    t.worker.to_string(),
                    t.read.to_string(),
                    t.reclaimed.to_string(),
                    t.processed.to_string(),
                    t.duplicates.to_string(),
                    t.acked.to_string(),
                ]
            })
            .collect::<Vec<_>>(),
    );
    let charges = charges.lock().expect("lock").clone();
    let total: u32 = charges.values().sum();
    let doubled = charges.values().filter(|n| **n > 1).count();
    println!(
        "\ncharges: {total} for 5 orders; doubled {doubled}; entries still pending: {pending_count}"
    );
    print_json(&serde_json::json!({
        "entries": orders.len(),
        "worker_1": w1,
        "worker_2": w2,
        "charges": total,
        "doubled": doubled,
        "distinct_orders_charged": charges.len(),
        "pending": pending_count,
    }));
    Ok(())
}

async fn read_new(
    redis: &mut MultiplexedConnection,
    stream: &str,
    consumer: &str,
    count: usize,
) -> redis::RedisResult<Vec<StreamId>> {
    let opts = StreamReadOptions::default()
        .group(GROUP, consumer)
        .count(count);
    let reply: Option<StreamReadReply> = redis.xread_options(&[stream], &[">"], &opts).await?;
    Ok(reply
        .map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect())
        .unwrap_or_default())
}

async fn handle(
    inbox: &Inbox<dyn DedupStore>,
    charges: &Charges,
    entry: &StreamId,
) -> Result<Handled, Box<dyn std::error::Error>> {
    let order: String = entry.get("message_id").ok_or("entry without message_id")?;
    let key = Key::new("billing", order.as_str())?;
    let charges = Arc::clone(charges);
    Ok(inbox
        .handle(&key, None, |_lease| async move {
            *charges.lock().expect("lock").entry(order).or_default() += 1;
            Ok::<_, std::io::Error>(Some(b"charged".to_vec()))
        })
        .await?)
}
