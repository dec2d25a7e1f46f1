//! `purge`: `SCAN` every node for the prefix, run `purge_one.lua` on what it finds.
//!
//! Redis already removes records by native expiry once they are past the store's
//! retention; `purge` is for a shorter retention than the configured one (or records left
//! behind by a store configured with a longer one). A batch is the purge of at most
//! `batch_size` records: keys from `SCAN` are sent in pipelines sized to what the current
//! batch may still remove, so no batch ever removes more than `batch_size`. Records past the
//! store's own retention are deleted on sight but not counted (they were already absent);
//! keys under the prefix that are not dedup records are left alone.

use dedup_core::{PurgeOptions, PurgeReport, Result};

use crate::RedisStore;
use crate::conn::Call;
use crate::error::backend;
use crate::reply::{self, Purged};
use crate::scripts::PURGE_ONE;

/// Keys asked of `SCAN` per step (a hint to the server, not a limit).
const SCAN_COUNT: usize = 1000;

pub(crate) async fn purge(store: &RedisStore, options: &PurgeOptions) -> Result<PurgeReport> {
    options.validate()?;
    let mut report = PurgeReport::default();
    let limit_reached =
        |report: &PurgeReport| options.max_batches.is_some_and(|max| report.batches >= max);
    // Records removed so far by the current batch.
    let mut removed_in_batch = 0;
    if limit_reached(&report) {
        return Ok(report);
    }
    let conn = store.conn();
    let pattern = format!("{}*", store.config().prefix);
    let retention_ms = dedup_core::duration_millis(options.retention);
    for node in conn.scan_nodes().await.map_err(backend)? {
        let mut cursor = 0;
        loop {
            let (next, keys) = conn
                .scan(&node, cursor, &pattern, SCAN_COUNT)
                .await
                .map_err(backend)?;
            let mut rest = keys.as_slice();
            while !rest.is_empty() {
                let take = rest.len().min(options.batch_size - removed_in_batch);
                let (chunk, tail) = rest.split_at(take);
                rest = tail;
                let now = store.now_arg();
                let calls: Vec<Call> = chunk
                    .iter()
                    .map(|k| {
                        Call::new(&PURGE_ONE, k.clone())
                            .arg(now.as_str())
                            .arg(retention_ms)
                    })
                    .collect();
                let replies = conn.eval_many(&calls, None).await.map_err(backend)?;
                for v in &replies.values {
                    match reply::purged(v) {
                        Purged::Completed => report.completed += 1,
                        Purged::Expired => report.expired += 1,
                        Purged::Nothing => continue,
                    }
                    removed_in_batch += 1;
                }
                if removed_in_batch == options.batch_size {
                    report.batches += 1;
                    removed_in_batch = 0;
                    if limit_reached(&report) {
                        return Ok(report);
                    }
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    // The last batch, short (possibly empty): the scan found nothing more to remove.
    report.batches += 1;
    Ok(report)
}
