//! Purge batches: `SCAN` every primary for the prefix, run `purge.lua` on what it finds (one
//! script call per batch of keys; in a cluster one per hash slot, the calls for the keys one
//! `SCAN` found, all on its primary, in one pipeline).
//!
//! Redis already removes records by native expiry once they are past the store's
//! retention; `purge` is for a shorter retention than the configured one (or records left
//! behind by a store configured with a longer one). A batch removes at most `step.limit`
//! records: keys from `SCAN` wait in the cursor and are sent in script calls sized to what
//! the batch may still remove. A paced batch also stops at its deadline, between round trips
//! (once what its last `SCAN` found is purged). Records past the store's own retention are
//! deleted on sight but not counted (they were already absent); keys under the prefix that
//! are not dedup records are left alone.
//!
//! The `SCAN` steps and the purge scripts each read the server's `TIME` at their start and
//! end (`lua/scan.lua`, `lua/purge_many.lua`), and a batch reports the sum as its
//! [`PurgeBatch::work`]: the time it held the server's one thread, which is what pacing
//! bounds. Its round trips' wall time would also count the wait behind other clients and
//! behind the purging process's own tasks, so under load the batches would shrink to the
//! floor and rest three times that wait.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dedup_core::backend::{PurgeBatch, PurgeBatches, PurgeStep};
use dedup_core::{Result, duration_millis};

use crate::RedisStore;
use crate::conn::{Call, ScanNode};
use crate::error::backend;
use crate::reply::{self, Purged};
use crate::scripts::PURGE_MANY;

/// Keys asked of one `SCAN` step, at most (a hint to the server, not a limit). `SCAN`
/// walks the whole keyspace, not just the prefix, and blocks the server while it does:
/// small steps keep every client of a shared server responsive.
const MAX_SCAN_COUNT: usize = 1000;
/// ... and at least.
const MIN_SCAN_COUNT: usize = 100;

/// Where a purge is in its walk of the keyspace, between batches.
#[derive(Debug, Default)]
pub struct Cursor {
    /// The primaries to scan (read at the first batch).
    nodes: Option<Vec<ScanNode>>,
    /// The node being scanned.
    node: usize,
    /// `SCAN`'s cursor on that node.
    scan: u64,
    /// Keys found and not yet looked at.
    pending: VecDeque<Vec<u8>>,
}

#[async_trait]
impl PurgeBatches for RedisStore {
    type PurgeCursor = Cursor;

    /// One batch: purge pending keys, scanning for more, until `step.limit` records were
    /// removed, the keyspace is walked, or the deadline passed. Its `work` is the server
    /// time its `SCAN` steps and purge scripts took (`TIME` inside them), not its round
    /// trips' wall time, which under load is mostly the wait behind other clients.
    async fn purge_batch(&self, step: &PurgeStep, cursor: &mut Cursor) -> Result<PurgeBatch> {
        let started = Instant::now();
        let mut held = Duration::ZERO;
        let mut batch = self.fill_batch(step, cursor, &mut held).await?;
        // The server's clock may step while the batch runs: never more than its wall time.
        batch.work = Some(held.min(started.elapsed()));
        Ok(batch)
    }
}

impl RedisStore {
    /// The batch's round trips, adding the server time each took to `held`.
    async fn fill_batch(
        &self,
        step: &PurgeStep,
        cursor: &mut Cursor,
        held: &mut Duration,
    ) -> Result<PurgeBatch> {
        let conn = self.purge_conn().await?;
        if cursor.nodes.is_none() {
            cursor.nodes = Some(conn.scan_nodes().await.map_err(backend)?);
        }
        let pattern = format!("{}*", self.config().prefix);
        let retention_ms = duration_millis(step.retention);
        let count = step.limit.clamp(MIN_SCAN_COUNT, MAX_SCAN_COUNT);
        let mut batch = PurgeBatch::default();
        loop {
            let room = step.limit - usize::try_from(batch.total()).unwrap_or(usize::MAX);
            if room == 0 {
                return Ok(batch);
            }
            if !cursor.pending.is_empty() {
                let take = cursor.pending.len().min(room);
                let now = self.now_arg();
                let calls: Vec<Call> = cursor
                    .pending
                    .drain(..take)
                    .map(|k| {
                        Call::new(&PURGE_MANY, k)
                            .arg(now.as_str())
                            .arg(retention_ms)
                    })
                    .collect();
                let replies = conn
                    .eval_batch(&PURGE_MANY, &calls, None)
                    .await
                    .map_err(backend)?;
                *held += replies.server_time;
                for v in &replies.values {
                    match reply::purged(v) {
                        Purged::Completed => batch.completed += 1,
                        Purged::Expired => batch.expired += 1,
                        Purged::Nothing => {}
                    }
                }
            } else {
                let nodes = cursor.nodes.as_deref().unwrap_or_default();
                let Some(node) = nodes.get(cursor.node) else {
                    batch.exhausted = true;
                    return Ok(batch);
                };
                let scanned = conn
                    .scan(node, cursor.scan, &pattern, count)
                    .await
                    .map_err(backend)?;
                *held += scanned.server_time;
                cursor.pending.extend(scanned.keys);
                if scanned.next == 0 {
                    cursor.node += 1;
                }
                cursor.scan = scanned.next;
            }
            // Keys a `SCAN` just found are purged before the batch ends: a batch that only
            // scanned would leave its rest for nothing when the server is busy.
            if cursor.pending.is_empty() && step.deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(batch);
            }
        }
    }
}
