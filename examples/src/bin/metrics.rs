//! Metrics for an operator: a consumer whose store wears the `Observed` layer, a `Purger`,
//! and the `metrics-exporter-prometheus` exporter serving everything on a loopback port.
//!
//! It runs a short scripted workload (new orders, redeliveries, a crashed worker's lease
//! taken over, a poison message dead-lettered, a declined card stored as a failure), prints
//! what it did, then serves `/metrics` until killed (or for `--serve-for` seconds):
//!
//! ```text
//! cargo run -p dedup-examples --features full --bin metrics -- --listen 127.0.0.1:9184
//! curl -s http://127.0.0.1:9184/metrics | grep ^dedup_
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use dedup::StoreUrl;
use dedup_core::layers::{ObserveOptions, Observed};
use dedup_core::{
    ClaimOptions, DedupStore, FailurePolicy, Handled, Inbox, InboxConfig, Key, Purger,
};
use dedup_examples::report::{print_json, print_table};
use metrics_exporter_prometheus::PrometheusBuilder;

/// Serve dedup's metrics for Prometheus after a scripted workload.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Store URL: `sqlite:PATH` (default: a temporary file), `memory:`, `postgres://...`,
    /// `redis://...`.
    #[arg(long)]
    store: Option<String>,
    /// Where to serve `/metrics` (loopback by default: metrics name your consumers).
    #[arg(long, default_value = "127.0.0.1:9184")]
    listen: SocketAddr,
    /// New orders to process.
    #[arg(long, default_value_t = 20)]
    orders: usize,
    /// How many of them are delivered a second time.
    #[arg(long, default_value_t = 5)]
    redeliveries: usize,
    /// Stop serving after this many seconds (0: serve until killed).
    #[arg(long, default_value_t = 0)]
    serve_for: u64,
}

/// What a processed order stores for its duplicates (as JSON).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Receipt {
    order: usize,
    charged_cents: u64,
}

#[derive(serde::Serialize)]
struct Summary {
    listen: String,
    backend: &'static str,
    processed: usize,
    duplicates: usize,
    takeovers: u64,
    dead_lettered: usize,
    failed: usize,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dedup_examples::exit::report(run().await.map_err(|e| e as Box<dyn std::error::Error>))
}

async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args = Args::parse();
    PrometheusBuilder::new()
        .with_http_listener(args.listen)
        .set_buckets(&[
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
        ])?
        .install()?;

    let tmp = tempfile::tempdir()?;
    let url = dedup_examples::url_or_temp_sqlite(args.store, tmp.path(), "metrics.db");
    let backend = StoreUrl::parse(&url)?.backend();
    let store = Arc::new(Observed::new(
        dedup::open(&url).await?,
        ObserveOptions::new(backend).without_message_ids(),
    ));
    let lease = Duration::from_secs(30);
    let purger = Purger::new(Duration::from_secs(7 * 86_400), Duration::from_secs(600))
        .longest_lease(lease)
        .redelivery_window(Duration::from_secs(3 * 86_400))
        .start(store.clone())?;

    // A consumer name of its own per run, so a shared server store starts empty.
    let consumer = format!(
        "billing-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let key = |id: &str| Key::new(consumer.as_str(), id);
    let config = InboxConfig {
        lease,
        ..InboxConfig::default()
    };
    let inbox = Inbox::from_arc(store.clone(), config.clone());
    let mut summary = Summary {
        listen: args.listen.to_string(),
        backend,
        processed: 0,
        duplicates: 0,
        takeovers: 0,
        dead_lettered: 0,
        failed: 0,
    };

    // New orders, then some of them redelivered: duplicates get the receipt back.
    let deliveries = (0..args.orders).chain(0..args.redeliveries.min(args.orders));
    for order in deliveries {
        let charge = |_lease| async move {
            Ok::<_, std::io::Error>(Receipt {
                order,
                charged_cents: 4999,
            })
        };
        match inbox
            .handle_json(&key(&format!("order-{order}"))?, None, charge)
            .await?
        {
            Handled::Processed { .. } => summary.processed += 1,
            Handled::Duplicate { .. } => summary.duplicates += 1,
            other => return Err(format!("order {order}: unexpected {other:?}").into()),
        }
    }

    // A worker claimed an order and crashed: its short lease runs out and the redelivery
    // takes the key over (attempt 2).
    let crashed = key("order-crashed")?;
    store
        .claim(&crashed, &ClaimOptions::lease(Duration::from_millis(200)))
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let handled = inbox
        .handle(&crashed, None, |_| async { Ok::<_, std::io::Error>(None) })
        .await?;
    if matches!(&handled, Handled::Processed { lease, .. } if lease.attempt == 2) {
        summary.processed += 1;
    }

    // A poison message: at most 2 attempts, then every delivery is told to dead-letter.
    let poison = Inbox::from_arc(
        store.clone(),
        InboxConfig {
            max_attempts: Some(2),
            ..config.clone()
        },
    );
    let malformed = key("order-malformed")?;
    for _ in 0..4 {
        let parse = |_| async { Err::<Option<Vec<u8>>, _>("malformed payload: no amount") };
        if let Ok(Handled::DeadLetter { .. }) = poison.handle(&malformed, None, parse).await {
            summary.dead_lettered += 1;
        }
    }

    // A declined card is a final answer: stored, and replayed to the redelivery.
    let stored = Inbox::from_arc(
        store.clone(),
        InboxConfig {
            failures: FailurePolicy::Store,
            ..config
        },
    );
    let declined = key("order-declined")?;
    for _ in 0..2 {
        let charge = |_| async { Err::<Option<Vec<u8>>, _>("card declined") };
        if let Handled::Failed { .. } = stored.handle(&declined, None, charge).await? {
            summary.failed += 1;
        }
    }
    summary.takeovers = store.counts().takeovers;

    let counts = store.counts();
    print_table(
        &[
            "acquired",
            "takeovers",
            "duplicates",
            "commits",
            "releases",
            "lease lost",
        ],
        &[vec![
            counts.acquired.to_string(),
            counts.takeovers.to_string(),
            counts.completed.to_string(),
            counts.commits.to_string(),
            counts.releases.to_string(),
            counts.lease_lost.to_string(),
        ]],
    );
    println!("serving metrics on http://{}/metrics", args.listen);
    print_json(&summary);
    if args.serve_for == 0 {
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(Duration::from_secs(args.serve_for)).await;
    purger.stop().await;
    Ok(())
}
