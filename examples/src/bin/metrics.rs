//! Metrics for an operator: a consumer whose store wears the `Observed` layer, a `Purger`,
//! and the `metrics-exporter-prometheus` exporter serving everything on a loopback port.
//!
//! It runs a short scripted workload (`dedup_examples::workload`: new orders, redeliveries,
//! a crashed worker's lease taken over, a poison message dead-lettered, a declined card
//! stored as a failure), prints what it did, then serves `/metrics` until killed (or for
//! `--serve-for` seconds):
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
use dedup_core::Purger;
use dedup_core::layers::{ObserveOptions, Observed};
use dedup_examples::report::{print_json, print_table};
use dedup_examples::workload::{self, Tally};
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

#[derive(serde::Serialize)]
struct Summary {
    listen: String,
    backend: &'static str,
    #[serde(flatten)]
    tally: Tally,
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

    let tally = workload::run(&store, lease, args.orders, args.redeliveries).await?;
    let summary = Summary {
        listen: args.listen.to_string(),
        backend,
        tally,
    };

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
