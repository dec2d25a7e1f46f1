//! `dedup outbox purge`: remove sent rows older than the retention.

use dedup_core::{PurgeOptions, parse_duration};
use serde_json::json;

use crate::StoreArgs;
use crate::failure::Failure;
use crate::open::{Access, open_outbox};
use crate::render::{print, span};

/// Purge the sent rows older than `retention`, in batches of `batch`.
pub(super) async fn run(
    args: &StoreArgs,
    as_json: bool,
    retention: &str,
    batch: usize,
    unpaced: bool,
) -> Result<(), Failure> {
    // Arguments first: a usage error never waits on a connection.
    let options = {
        let retention =
            parse_duration(retention).map_err(|e| Failure::store("invalid --retention", e))?;
        let mut options = PurgeOptions::older_than(retention).batch_size(batch);
        if unpaced {
            options = options.unpaced();
        }
        options
            .validate()
            .map_err(|e| Failure::store("invalid purge options", e))?;
        options
    };
    let (outbox, _) = open_outbox(args, Access::Write).await?;
    let report = outbox
        .purge(&options)
        .await
        .map_err(|e| Failure::store("cannot purge the outbox", e))?;
    print(
        as_json,
        json!({
            "removed": report.completed,
            "batches": report.batches,
            "elapsed_ms": report.elapsed.as_millis() as u64,
        }),
        || {
            format!(
                "removed {} sent rows older than {retention} in {} batches ({})",
                report.completed,
                report.batches,
                span(report.elapsed)
            )
        },
    );
    Ok(())
}
