//! `dedup purge`: remove records older than the retention, or count them (`--dry-run`).

use std::io::IsTerminal;
use std::time::Duration;

use dedup_core::{PurgeOptions, parse_duration};
use serde_json::json;

use crate::StoreArgs;
use crate::failure::Failure;
use crate::open::{Access, Opened, open};
use crate::render::{print, span};

/// Purge the records older than `older_than`, in batches of `batch` (only count them with
/// `dry_run`).
pub(super) async fn run(
    args: &StoreArgs,
    as_json: bool,
    older_than: &str,
    batch: usize,
    dry_run: bool,
    unpaced: bool,
) -> Result<(), Failure> {
    // Arguments are checked before the store is opened: a usage error never waits on a
    // connection, and is reported as one (exit code 2).
    let options = purge_options(older_than, batch, unpaced)?;
    let access = if dry_run { Access::Read } else { Access::Write };
    let Opened { store, .. } = open(args, access).await?;
    purge(&*store, older_than, options, dry_run, as_json).await
}

/// The purge the arguments ask for, checked.
fn purge_options(older_than: &str, batch: usize, unpaced: bool) -> Result<PurgeOptions, Failure> {
    let retention =
        parse_duration(older_than).map_err(|e| Failure::store("invalid --older-than", e))?;
    let mut options = PurgeOptions::older_than(retention).batch_size(batch);
    if unpaced {
        options = options.unpaced();
    }
    options
        .validate()
        .map_err(|e| Failure::store("invalid purge options", e))?;
    Ok(options)
}

/// `dedup purge`: the dry run's count, then (unless `dry_run`) the purge, with a spinner
/// on a terminal and plain lines otherwise.
async fn purge(
    store: &dyn dedup_core::Admin,
    older_than: &str,
    options: PurgeOptions,
    dry_run: bool,
    as_json: bool,
) -> Result<(), Failure> {
    let count = store
        .count_purgeable(options.retention)
        .await
        .map_err(|e| Failure::store("cannot count purgeable records", e))?;
    if dry_run {
        print(
            as_json,
            json!({
                "dry_run": true,
                "older_than": older_than,
                "completed": count.completed,
                "expired": count.expired,
                "total": count.total(),
            }),
            || {
                format!(
                    "dry run: would remove {} records older than {older_than} ({} completed, {} \
                     expired leases)",
                    count.total(),
                    count.completed,
                    count.expired
                )
            },
        );
        return Ok(());
    }
    let terminal = !as_json && std::io::stderr().is_terminal();
    let start = format!(
        "purging records older than {older_than}: {} to remove ({} completed, {} expired), {}",
        count.total(),
        count.completed,
        count.expired,
        if options.pace == dedup_core::Pace::Unpaced {
            "unpaced"
        } else {
            "paced"
        }
    );
    let spinner = if terminal {
        let bar = indicatif::ProgressBar::new_spinner().with_message(start);
        bar.enable_steady_tick(Duration::from_millis(120));
        Some(bar)
    } else {
        if !as_json {
            eprintln!("{start}");
        }
        None
    };
    let result = store.purge(&options).await;
    if let Some(bar) = &spinner {
        bar.finish_and_clear();
    }
    let report = result.map_err(|e| Failure::store("the purge failed", e))?;
    print(
        as_json,
        json!({
            "dry_run": false,
            "older_than": older_than,
            "completed": report.completed,
            "expired": report.expired,
            "total": report.total(),
            "batches": report.batches,
            "elapsed_ms": report.elapsed.as_millis() as u64,
        }),
        || {
            format!(
                "removed {} records ({} completed, {} expired leases) in {} batch{}, {}",
                report.total(),
                report.completed,
                report.expired,
                report.batches,
                if report.batches == 1 { "" } else { "es" },
                span(report.elapsed)
            )
        },
    );
    Ok(())
}
