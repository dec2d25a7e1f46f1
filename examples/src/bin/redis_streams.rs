//! Redis Streams consumer group, deduplicated with an `Inbox`.
//!
//! Five orders are added to a stream, order-2 twice (a producer retry). Worker 1 reads
//! four entries, processes and commits them, and dies before its `XACK`: they stay pending.
//! Worker 2 reclaims them with `XAUTOCLAIM` once they have been idle long enough: each is
//! a duplicate, acknowledged without charging. Then it reads the new entries and processes
//! them. Every order is charged once and nothing stays pending.
//!
//! Both workers are `dedup-brokers`' `StreamConsumer` running `with_inbox`: the adapter
//! takes each key from the entry's `message_id` field, `XACK`s processed entries and
//! duplicates, and reclaims idle pending entries.
//!
//! Needs a Redis server: `--redis URL` or `DEDUP_REDIS_URL`.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use dedup_brokers::redis_streams::StreamConsumer;
use dedup_brokers::shutdown;
use dedup_examples::orders::{self, Charges, SENT, Tally};
use dedup_examples::report::print_json;
use redis::AsyncCommands;

/// Redis Streams: a dead consumer's pending entries reclaimed and processed once.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Redis URL (default: $DEDUP_REDIS_URL, else redis://127.0.0.1:6379/).
    #[arg(long)]
    redis: Option<String>,
    /// Store URL (default: an SQLite file in a temporary folder).
    #[arg(long)]
    store: Option<String>,
}

const GROUP: &str = "billing";
/// How long an entry stays pending before another worker may reclaim it.
const MIN_IDLE: Duration = Duration::from_millis(200);
/// How long the program waits for each worker's part.
const PART: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dedup_examples::exit::report(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let Args { redis, store } = Args::parse();
    let tmp = tempfile::tempdir()?;
    let url = dedup_examples::url_or_temp_sqlite(store, tmp.path(), "inbox.db");
    let store = dedup::open(&url).await?;
    let redis = redis.or_else(|| std::env::var("DEDUP_REDIS_URL").ok());
    let client = redis::Client::open(redis.as_deref().unwrap_or("redis://127.0.0.1:6379/"))?;
    let mut redis = client.get_multiplexed_async_connection().await?;
    let stream = format!("orders-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let _: () = redis::cmd("XGROUP")
        .arg(&["CREATE", &stream, GROUP, "$", "MKSTREAM"])
        .query_async(&mut redis)
        .await?;
    for order in SENT {
        let _: String = redis.xadd(&stream, "*", &[("message_id", order)]).await?;
    }
    let charges = Charges::default();
    let worker = |name, in_flight| {
        StreamConsumer::new(
            client.clone(),
            &stream,
            GROUP,
            name,
            orders::config(in_flight),
        )
    };

    // Worker 1: each handler commits, then hangs (the process as good as dead before its
    // XACKs); killed once it handled four.
    let w1 = Tally::shared("worker-1 (died before XACK)");
    let counted = orders::billing(Arc::clone(&store), Arc::new(charges.clone()), &w1);
    let worker_1 =
        tokio::spawn(worker("worker-1", 4).run(orders::dying_after(counted, None), shutdown().1));
    orders::stop_when(&w1, PART, |t| t.deliveries >= 4)
        .wait()
        .await;
    worker_1.abort(); // ... the process dies here: no XACK.

    // Worker 2: reclaims what has been pending long enough, reads new entries; stops once
    // it handled all six entries.
    tokio::time::sleep(MIN_IDLE + Duration::from_millis(50)).await;
    let w2 = Tally::shared("worker-2");
    let stopped = orders::stop_when(&w2, PART, |t| t.deliveries >= 6);
    let counted = orders::billing(store, Arc::new(charges.clone()), &w2);
    worker("worker-2", 10)
        .claim_idle(MIN_IDLE)
        .run(counted, stopped)
        .await?;
    let (w1, w2) = (orders::take(&w1), orders::take(&w2));
    let pending: redis::Value = redis::cmd("XPENDING")
        .arg(&stream)
        .arg(GROUP)
        .query_async(&mut redis)
        .await?;
    let pending = match pending {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Int(n)) => *n,
            _ => -1,
        },
        _ => -1,
    };
    let _: () = redis.del(&stream).await?;

    orders::print_tallies(&[&w1, &w2]);
    let charges = orders::lock(&charges).clone();
    let (total, doubled, _) = orders::count(&charges);
    println!(
        "\ncharges: {total} for 5 orders; doubled {doubled}; entries still pending: {pending}"
    );
    print_json(&serde_json::json!({
        "entries": SENT.len(), "worker_1": w1, "worker_2": w2, "charges": total,
        "doubled": doubled, "distinct_orders_charged": charges.len(), "pending": pending,
    }));
    Ok(())
}
