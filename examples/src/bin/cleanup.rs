//! The cleanup job: retention of 7 days. Records processed 10 days ago (and leases
//! abandoned 10 days ago) are purged in batches; records processed 1 day ago and a live
//! lease are kept. The store runs on a manual clock so "10 days ago" takes no waiting.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use dedup_core::{
    Claim, ClaimOptions, Clock, DedupStore, Key, ManualClock, PurgeOptions, SystemClock,
};
use dedup_examples::report::{print_json, print_table};

const DAY: Duration = Duration::from_secs(86_400);

/// Purge records older than the retention window, in batches.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Store URL: `sqlite:PATH` (default: a temporary file), `memory:` or `postgres://...`.
    /// (Redis expires records by itself; see the dedup-redis README.)
    #[arg(long)]
    store: Option<String>,
    /// Records processed 10 days ago.
    #[arg(long, default_value_t = 250)]
    old: usize,
    /// Leases abandoned 10 days ago (a worker died and nobody redelivered).
    #[arg(long, default_value_t = 5)]
    abandoned: usize,
    /// Records processed 1 day ago.
    #[arg(long, default_value_t = 100)]
    recent: usize,
    /// Records per purge batch, at most.
    #[arg(long, default_value_t = 100)]
    batch_size: usize,
    /// Purge unpaced (a maintenance window): full batches back to back. By default the
    /// purge is paced: small batches sized by time, with rests, so live traffic goes on.
    #[arg(long)]
    unpaced: bool,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dedup_examples::exit::report(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let tmp = tempfile::tempdir()?;
    let url = dedup_examples::url_or_temp_sqlite(args.store, tmp.path(), "cleanup.db");
    let today = SystemClock.now();
    let clock = Arc::new(ManualClock::new(today));
    let store = dedup::open_with_clock(&url, clock.clone()).await?;
    let consumer = format!("cleanup-{}", uuid::Uuid::new_v4().simple());
    let key = |kind: &str, i: usize| Key::new(consumer.as_str(), format!("{kind}-{i}"));

    clock.set(today.saturating_sub(DAY * 10));
    for i in 0..args.old {
        process(&*store, &key("old", i)?).await?;
    }
    let minute = ClaimOptions::lease(Duration::from_secs(60));
    for i in 0..args.abandoned {
        store.claim(&key("abandoned", i)?, &minute).await?;
    }
    clock.set(today.saturating_sub(DAY));
    for i in 0..args.recent {
        process(&*store, &key("recent", i)?).await?;
    }
    clock.set(today);
    let live = key("live", 0)?;
    store.claim(&live, &minute).await?;

    let options = PurgeOptions::older_than(DAY * 7).batch_size(args.batch_size);
    let options = if args.unpaced {
        options.unpaced()
    } else {
        options
    };
    let report = store.purge(&options).await?;

    let (mut old_left, mut recent_kept) = (0, 0);
    for (kind, n, left) in [
        ("old", args.old, &mut old_left),
        ("recent", args.recent, &mut recent_kept),
    ] {
        for i in 0..n {
            *left += usize::from(store.get(&key(kind, i)?).await?.is_some());
        }
    }
    let live_kept = store.get(&live).await?.is_some();
    let elapsed_ms = report.elapsed.as_secs_f64() * 1000.0;
    let outcome = serde_json::json!({
        "retention_days": 7, "purged_completed": report.completed, "purged_expired": report.expired,
        "batches": report.batches, "paced": !args.unpaced, "elapsed_ms": elapsed_ms,
        "old_left": old_left, "recent_kept": recent_kept, "live_kept": live_kept,
    });
    print_table(
        &["records", "created", "before", "after"],
        &[
            row("processed", "10 days ago", args.old, old_left),
            row(
                "abandoned leases",
                "10 days ago",
                args.abandoned,
                args.abandoned - report.expired as usize,
            ),
            row("processed", "1 day ago", args.recent, recent_kept),
            row("live lease", "now", 1, usize::from(live_kept)),
        ],
    );
    println!(
        "purge(retention 7 days, {}, batches of at most {}): removed {} completed + {} expired \
         in {} batches, {:.1} ms ({:.0} records/s)",
        if args.unpaced { "unpaced" } else { "paced" },
        args.batch_size,
        report.completed,
        report.expired,
        report.batches,
        elapsed_ms,
        report.rate()
    );
    print_json(&outcome);
    Ok(())
}

fn row(what: &str, when: &str, before: usize, after: usize) -> Vec<String> {
    let counts = [before, after].map(|n| n.to_string());
    [what.into(), when.into()]
        .into_iter()
        .chain(counts)
        .collect()
}

async fn process(store: &dyn DedupStore, key: &Key) -> dedup_core::Result<()> {
    match store.claim(key, &ClaimOptions::default()).await? {
        Claim::Acquired(lease) => store.commit(&lease, None).await,
        other => panic!("fresh key {key} must be acquired, got {other:?}"),
    }
}
