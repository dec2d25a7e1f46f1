//! The main demo: at-least-once delivery with duplicates, crashes and concurrent workers,
//! consumed by a naive check-then-act consumer and by a dedup consumer on the same stream.
//!
//! `cargo run --release` runs it on an embedded SQLite file; `--store URL` picks another
//! backend (`memory:`, `sqlite:PATH`, `postgres://...`, `redis://...`); `--help` lists the
//! knobs.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use dedup_examples::sim::{self, Consumer, SimConfig, SimReport};
use dedup_examples::sim_output;

/// Naive vs dedup consumer on the same at-least-once delivery stream.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Store for the dedup consumer (default: an SQLite file in a temporary folder).
    #[arg(long)]
    store: Option<String>,
    /// Distinct messages published.
    #[arg(long, default_value_t = 1000)]
    messages: usize,
    /// Probability that the publisher sends a message twice.
    #[arg(long, default_value_t = 0.2)]
    duplicate_rate: f64,
    /// Probability that a worker crashes after the charge, before the ack.
    #[arg(long, default_value_t = 0.05)]
    crash_rate: f64,
    /// Concurrent workers per consumer.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Seed of the delivery stream.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Lease of the dedup consumer, in milliseconds.
    #[arg(long, default_value_t = 500)]
    lease_ms: u64,
    /// Also print each result as a JSON line.
    #[arg(long)]
    json: bool,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dedup_examples::exit::report(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    for (name, p) in [
        ("duplicate-rate", args.duplicate_rate),
        ("crash-rate", args.crash_rate),
    ] {
        if !(0.0..=1.0).contains(&p) {
            return Err(format!("--{name} must be between 0 and 1, got {p}").into());
        }
    }
    let cfg = SimConfig {
        messages: args.messages,
        duplicate_rate: args.duplicate_rate,
        crash_rate: args.crash_rate,
        workers: args.concurrency,
        seed: args.seed,
        lease: Duration::from_millis(args.lease_ms.max(1)),
        ..SimConfig::default()
    };
    let tmp = tempfile::tempdir()?;
    let url = dedup_examples::url_or_temp_sqlite(args.store, tmp.path(), "dedup-demo.db");
    let store = dedup::open(&url).await?;
    // A fresh consumer name per run, so re-running against a persistent store starts clean.
    let consumer_name = format!(
        "demo-billing-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    println!(
        "{} messages, duplicate rate {}, crash rate {}, {} workers, store {}",
        cfg.messages,
        cfg.duplicate_rate,
        cfg.crash_rate,
        cfg.workers,
        dedup::url::redact(&url)
    );

    let mut reports: Vec<SimReport> = Vec::new();
    for consumer in [Consumer::Naive, Consumer::Dedup] {
        let bar = sim_output::progress_bar(&cfg, consumer);
        let tick = {
            let bar = bar.clone();
            Arc::new(move || bar.inc(1)) as Arc<dyn Fn() + Send + Sync>
        };
        let report = sim::run(&cfg, consumer, Arc::clone(&store), &consumer_name, tick).await?;
        bar.finish_and_clear();
        reports.push(report);
    }

    println!();
    sim_output::print_reports(&reports, args.lease_ms, args.json);
    let (naive, dedup) = (&reports[0], &reports[1]);
    println!();
    println!(
        "naive: {} messages charged twice or more; dedup: {} doubled, {} lost.",
        naive.doubled, dedup.doubled, dedup.lost
    );
    if dedup.doubled > 0 || dedup.lost > 0 {
        return Err("the dedup consumer doubled or lost a charge: this is a bug".into());
    }
    Ok(())
}
