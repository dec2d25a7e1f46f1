//! Purge batches: a batch is a few purge steps (`lua/purge_step.lua`), each one script call
//! on one node (the server, or one cluster primary by address) that goes on with that
//! node's `SCAN` from its cursor and runs `purge.lua` on every key it finds, in place: the
//! keys never travel to the client and back, and a cluster primary purges keys of all its
//! slots in one call. The nodes are walked one after the other: steps on every primary at
//! once purged faster, but on a machine where the primaries share cores they made claims
//! wait for CPU (measured in `BENCHMARKS.md`).
//!
//! Redis already removes records by native expiry once they are past the store's
//! retention; `purge` is for a shorter retention than the configured one (or records left
//! behind by a store configured with a longer one). A batch removes at most `step.limit`
//! records. A step stops taking keys once it has held the server for its budget and hands
//! back the keys it did not look at, which the next step takes first: a live claim queued
//! behind the purge waits for one step at most, and the claims queued meanwhile run between
//! two steps. A paced step's budget follows the wait live traffic sees ([`paced_step`]):
//! 150 µs on a quiet server, up to 1 ms on one so busy that a claim already waits longer
//! for its turn. A paced batch also stops at its
//! deadline, between steps. Records past the store's own retention are deleted on sight but
//! not counted (they were already absent); keys under the prefix that are not dedup records
//! are left alone. A key whose slot moved to another primary since `SCAN` found it comes
//! back from the step and is purged through the cluster client (`lua/purge_many.lua`),
//! which follows the redirection.
//!
//! Each step reads the server's `TIME` at its start and end, and a batch reports the sum as
//! its [`PurgeBatch::work`]: the time it held the server's one thread, which is what pacing
//! bounds. Its round trips' wall time would also count the wait behind other clients and
//! behind the purging process's own tasks, so under load the batches would shrink to the
//! floor and rest three times that wait.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use dedup_core::backend::{PurgeBatch, PurgeBatches, PurgeStep};
use dedup_core::{Result, duration_millis};
use redis::Cmd;

use crate::RedisStore;
use crate::conn::{Call, Conn, ScanNode};
use crate::error::backend;
use crate::reply::{self, Purged};
use crate::scripts::{PURGE_MANY, PURGE_STEP};

/// The shortest a paced step holds the server: a fraction of a local claim's round trip.
const MIN_PACED_HOLD: Duration = Duration::from_micros(150);
/// ... and the longest (the default batch time).
const MAX_PACED_HOLD: Duration = Duration::from_millis(1);
/// A paced step's budget never falls below this, so every step makes progress even when
/// the batch's deadline is (nearly) reached.
const MIN_STEP_HOLD: Duration = Duration::from_micros(50);
/// An unpaced step ends for lack of room, or once it purged what one `SCAN` step found.
const UNPACED_STEP_HOLD: Duration = Duration::from_secs(1);
/// Keys a step asks of `SCAN` (a hint to the server, not a limit), at least: `SCAN` walks
/// the whole keyspace, not just the prefix, and holds the server while it does.
const MIN_SCAN_COUNT: usize = 50;
/// ... and at most.
const MAX_SCAN_COUNT: usize = 1000;
/// Microseconds of a paced step's hold per key asked of `SCAN`: `SCAN` takes about 2 µs per
/// key and the purge of a record about as much, so a step spends about half its hold
/// scanning (measured on the benchmark's server).
const HOLD_US_PER_SCANNED_KEY: u128 = 4;

/// How long a paced step may hold the server, and the keys it asks of `SCAN`: half the
/// wait the purge's last step saw behind other clients (a live claim queued behind the
/// step waits at most half what it waits for its turn anyway), within
/// [`MIN_PACED_HOLD`]..=[`MAX_PACED_HOLD`], and no longer than what is left of the batch.
fn paced_step(last_wait: Duration, left_of_batch: Duration) -> (Duration, usize) {
    let hold = (last_wait / 2)
        .clamp(MIN_PACED_HOLD, MAX_PACED_HOLD)
        .min(left_of_batch)
        .max(MIN_STEP_HOLD);
    let count =
        usize::try_from(hold.as_micros() / HOLD_US_PER_SCANNED_KEY).unwrap_or(MAX_SCAN_COUNT);
    (hold, count.clamp(MIN_SCAN_COUNT, MAX_SCAN_COUNT))
}

/// Where a purge is in its walk of the keyspace, between batches.
#[derive(Debug, Default)]
pub struct Cursor {
    /// Each primary's walk (read at the first batch).
    walks: Option<Vec<Walk>>,
    /// Keys whose slot moved to another node since they were found.
    moved: Vec<Vec<u8>>,
}

/// One node's walk of its keyspace.
#[derive(Debug)]
struct Walk {
    /// The node.
    node: ScanNode,
    /// `SCAN`'s cursor on it.
    scan: u64,
    /// Its keyspace is walked (keys it found may still be pending).
    walked: bool,
    /// Keys its `SCAN` found and no step looked at yet.
    pending: Vec<Vec<u8>>,
    /// How long its last step waited behind other clients (the round trip less the time
    /// the step held the server).
    last_wait: Duration,
}

impl Walk {
    fn new(node: ScanNode) -> Self {
        Walk {
            node,
            scan: 0,
            walked: false,
            pending: Vec::new(),
            last_wait: Duration::ZERO,
        }
    }

    fn done(&self) -> bool {
        self.walked && self.pending.is_empty()
    }
}

/// What one step did.
struct Stepped {
    completed: u64,
    expired: u64,
    elsewhere: Vec<Vec<u8>>,
    server_time: Duration,
}

#[async_trait]
impl PurgeBatches for RedisStore {
    type PurgeCursor = Cursor;

    /// One batch: purge steps until `step.limit` records were removed, the keyspace is
    /// walked, or the deadline passed. Its `work` is the server time its steps took (`TIME`
    /// inside them), not its round trips' wall time, which under load is mostly the wait
    /// behind other clients.
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
    /// The batch's steps, adding the server time each took to `held`.
    async fn fill_batch(
        &self,
        step: &PurgeStep,
        cursor: &mut Cursor,
        held: &mut Duration,
    ) -> Result<PurgeBatch> {
        let conn = self.purge_conn().await?;
        if cursor.walks.is_none() {
            let nodes = conn.scan_nodes().await.map_err(backend)?;
            cursor.walks = Some(nodes.into_iter().map(Walk::new).collect());
        }
        let pattern = format!("{}*", self.config().prefix);
        let mut batch = PurgeBatch::default();
        loop {
            let room = step
                .limit
                .saturating_sub(usize::try_from(batch.total()).unwrap_or(usize::MAX));
            if room == 0 {
                return Ok(batch);
            }
            if !cursor.moved.is_empty() {
                let take = cursor.moved.len().min(room);
                let keys: Vec<_> = cursor.moved.drain(..take).collect();
                self.purge_moved(conn, keys, step, &mut batch, held).await?;
                continue;
            }
            let walks = cursor.walks.as_deref_mut().unwrap_or_default();
            let Some(walk) = walks.iter_mut().find(|w| !w.done()) else {
                batch.exhausted = true;
                return Ok(batch);
            };
            let done = self.step(conn, walk, step, room, &pattern).await?;
            *held += done.server_time;
            batch.completed += done.completed;
            batch.expired += done.expired;
            cursor.moved.extend(done.elsewhere);
            if step.deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(batch);
            }
        }
    }

    /// One step of `walk`, removing at most `room` records.
    async fn step(
        &self,
        conn: &Conn,
        walk: &mut Walk,
        step: &PurgeStep,
        room: usize,
        pattern: &str,
    ) -> Result<Stepped> {
        let (budget, count) = match step.deadline {
            Some(deadline) => paced_step(
                walk.last_wait,
                deadline.saturating_duration_since(Instant::now()),
            ),
            None => (
                UNPACED_STEP_HOLD,
                step.limit.clamp(MIN_SCAN_COUNT, MAX_SCAN_COUNT),
            ),
        };
        let scan = (!walk.walked).then_some(walk.scan);
        let cmd = self.step_cmd(step, room, budget, scan, pattern, count, &walk.pending);
        let sent = Instant::now();
        let value = conn.eval_on(&walk.node, &cmd).await.map_err(backend)?;
        let done = reply::purge_step(value).map_err(backend)?;
        walk.last_wait = sent.elapsed().saturating_sub(done.server_time);
        if let Some(next) = done.cursor {
            walk.scan = next;
            walk.walked = next == 0;
        }
        walk.pending = done.left;
        Ok(Stepped {
            completed: done.completed,
            expired: done.expired,
            elsewhere: done.elsewhere,
            server_time: done.server_time,
        })
    }

    /// `lua/purge_step.lua`'s call: no keys; `scan` is the cursor to go on from (`None`:
    /// purge `pending` only).
    #[allow(clippy::too_many_arguments)]
    fn step_cmd(
        &self,
        step: &PurgeStep,
        room: usize,
        budget: Duration,
        scan: Option<u64>,
        pattern: &str,
        count: usize,
        pending: &[Vec<u8>],
    ) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&PURGE_STEP.sha)
            .arg(0)
            .arg(self.now_arg())
            .arg(duration_millis(step.retention))
            .arg(room)
            .arg(u64::try_from(budget.as_micros()).unwrap_or(u64::MAX))
            .arg(scan.map(|c| c.to_string()).unwrap_or_default())
            .arg(pattern)
            .arg(count);
        for key in pending {
            cmd.arg(key);
        }
        cmd
    }

    /// Purge keys whose slot moved since they were found, through the cluster client
    /// (one `lua/purge_many.lua` call per slot, redirections followed).
    async fn purge_moved(
        &self,
        conn: &Conn,
        keys: Vec<Vec<u8>>,
        step: &PurgeStep,
        batch: &mut PurgeBatch,
        held: &mut Duration,
    ) -> Result<()> {
        let now = self.now_arg();
        let retention_ms = duration_millis(step.retention);
        let calls: Vec<Call> = keys
            .into_iter()
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn a_paced_step_holds_half_the_wait_within_bounds() {
        // Quiet server: the floor, and the fewest keys asked of SCAN.
        assert_eq!(paced_step(Duration::ZERO, 1000 * US), (150 * US, 50));
        assert_eq!(paced_step(100 * US, 1000 * US), (150 * US, 50));
        // Busy: half the wait.
        assert_eq!(paced_step(800 * US, 1000 * US), (400 * US, 100));
        // Very busy: at most 1 ms.
        assert_eq!(paced_step(10_000 * US, 5000 * US), (1000 * US, 250));
        // Never past the batch's deadline, but never nothing either.
        assert_eq!(paced_step(800 * US, 300 * US), (300 * US, 75));
        assert_eq!(paced_step(800 * US, Duration::ZERO), (50 * US, 50));
    }
}
