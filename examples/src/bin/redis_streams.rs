//! Redis Streams consumer group, deduplicated with an `Inbox`.
//!
//! The run: five orders are added to a stream, order-2 twice (a producer retry). Worker 1
//! reads a batch of four entries, processes and commits them, and dies before its batched
//! `XACK`: the entries stay pending for worker 1. Worker 2 reclaims the dead worker's
//! pending entries with `XAUTOCLAIM` once they have been idle long enough: each reclaimed
//! entry is a duplicate (acknowledged without charging). Worker 2 then reads the new
//! entries and processes them. Every order is charged exactly once and nothing stays pending.
//!
//! Both workers are `dedup-brokers`' `StreamConsumer` running `with_inbox`: the adapter
//! takes each key from the entry's `message_id` field, `XACK`s processed entries and
//! duplicates, and reclaims idle pending entries; this program only counts what its handler
//! saw, and makes worker 1 hang after each commit until it is killed.
//!
//! Needs a Redis server: `--redis URL` or `DEDUP_REDIS_URL`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use dedup_brokers::redis_streams::StreamConsumer;
use dedup_brokers::{ConsumerConfig, Delivery, Handle, shutdown, with_inbox};
use dedup_core::{BoxError, DedupStore, Handled, Inbox, InboxConfig, InboxError, Key};
use dedup_examples::report::{print_json, print_table};
use redis::AsyncCommands;

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
    /// New entries handled.
    read: u32,
    /// Reclaimed entries handled.
    reclaimed: u32,
    processed: u32,
    duplicates: u32,
    /// Handled entries the adapter acks (processed or duplicate); none for worker 1, which
    /// hangs before its acks.
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
    let store = dedup::open(&store_url).await?;
    let client = redis::Client::open(url.as_str())?;
    let mut redis = client.get_multiplexed_async_connection().await?;
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

    // Worker 1: four entries in flight at most; each handler commits, then hangs (the
    // process is as good as dead before its XACKs); killed once it handled four.
    let w1 = Arc::new(Mutex::new(Tally {
        worker: "worker-1 (died before XACK)",
        ..Tally::default()
    }));
    let (handled_four, mut four_handled) = tokio::sync::watch::channel(0u32);
    let worker_1 = {
        let counted = counting(
            charging(Arc::clone(&store), &charges),
            Arc::clone(&w1),
            false,
        );
        let handler = move |key: Key, delivery: Delivery| {
            let (counted, handled_four) = (Arc::clone(&counted), handled_four.clone());
            async move {
                let _ = counted.handle(&key, &delivery).await;
                handled_four.send_modify(|n| *n += 1);
                std::future::pending::<Result<Handled, InboxError>>().await
            }
        };
        let consumer = StreamConsumer::new(client.clone(), &stream, GROUP, "worker-1", config(4));
        tokio::spawn(async move { consumer.run(handler, shutdown().1).await })
    };
    tokio::time::timeout(Duration::from_secs(10), four_handled.wait_for(|n| *n >= 4)).await??;
    worker_1.abort(); // ... the process dies here: no XACK.

    // Worker 2: reclaims what has been pending long enough, reads new entries; stops once
    // it handled all six entries.
    tokio::time::sleep(MIN_IDLE + Duration::from_millis(50)).await;
    let w2 = Arc::new(Mutex::new(Tally {
        worker: "worker-2",
        ..Tally::default()
    }));
    let counted = counting(charging(store, &charges), Arc::clone(&w2), true);
    let (stop, stopped) = shutdown();
    let (handled, mut all_handled) = tokio::sync::watch::channel(0usize);
    let handler = move |key: Key, delivery: Delivery| {
        let (counted, handled) = (Arc::clone(&counted), handled.clone());
        async move {
            let answer = counted.handle(&key, &delivery).await;
            handled.send_modify(|n| *n += 1);
            answer
        }
    };
    let worker_2 =
        StreamConsumer::new(client, &stream, GROUP, "worker-2", config(10)).claim_idle(MIN_IDLE);
    let watcher = tokio::spawn(async move {
        let _ = tokio::time::timeout(
            Duration::from_secs(10),
            all_handled.wait_for(|n| *n >= orders.len()),
        )
        .await;
        stop.shut_down();
    });
    worker_2.run(handler, stopped).await?;
    watcher.await?;
    let (w1, w2) = (take(&w1), take(&w2));
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

fn config(in_flight: usize) -> ConsumerConfig {
    ConsumerConfig {
        consumer: Some(GROUP.into()),
        in_flight,
        ..ConsumerConfig::default()
    }
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
            *charges.lock().expect("lock").entry(order).or_default() += 1;
            Ok::<_, BoxError>(Some(b"charged".to_vec()))
        }
    }))
}

/// `inner`, counting into `tally` what it was given and answered, and (`acks`: a worker
/// that lives to ack) what the adapter acks: entries processed or duplicate.
fn counting(inner: Arc<dyn Handle>, tally: Arc<Mutex<Tally>>, acks: bool) -> Arc<dyn Handle> {
    Arc::new(move |key: Key, delivery: Delivery| {
        let (inner, tally) = (Arc::clone(&inner), Arc::clone(&tally));
        async move {
            let handled = inner.handle(&key, &delivery).await;
            let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
            match delivery.redelivered {
                true => t.reclaimed += 1,
                false => t.read += 1,
            }
            match &handled {
                Ok(Handled::Processed { .. }) => t.processed += 1,
                Ok(Handled::Duplicate { .. }) => t.duplicates += 1,
                _ => {}
            }
            if acks
                && matches!(
                    &handled,
                    Ok(Handled::Processed { .. } | Handled::Duplicate { .. })
                )
            {
                t.acked += 1;
            }
            handled
        }
    })
}
