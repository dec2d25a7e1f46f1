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
//! back from the step and is purged through the cluster client (`lua/many.lua` over
//! `purge.lua`),
//! which follows the redirection.
//!
//! The last purge run is one hash under the prefix ([`purge_run_key`]), written by
//! `lua/purge_run.lua` (its finish time from the store's clock: `TIME` unless injected) and
//! read with `HMGET`.
//!
//! Each step reads the server's `TIME` at its start and end, and a batch reports the sum as
//! its [`PurgeBatch::work`]: the time it held the server's one thread, which is what pacing
//! bounds. Its round trips' wall time would also count the wait behind other clients and
//! behind the purging process's own tasks, so under load the batches would shrink to the
//! floor and rest three times that wait.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use dedup_core::backend::{PurgeBatch, PurgeBatches, PurgeStep};
use dedup_core::{PurgeReport, PurgeRun, Result, duration_millis};
use redis::Cmd;

use crate::RedisStore;
use crate::conn::Conn;
use crate::decode::{self, purge::Purged};
use crate::error::backend;
use crate::nodes::ScanNode;
use crate::schema::purge_run_key;
use crate::scripts::{Call, PURGE_MANY, PURGE_RUN, PURGE_STEP};

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

/// A step's budget and `SCAN` count: paced ([`paced_step`]) when the batch has a deadline,
/// otherwise until it runs out of room or purged what one `SCAN` step found.
fn step_budget(step: &PurgeStep, walk: &Walk) -> (Duration, usize) {
    match step.deadline {
        Some(deadline) => paced_step(
            walk.last_wait,
            deadline.saturating_duration_since(Instant::now()),
        ),
        None => (
            UNPACED_STEP_HOLD,
            step.limit.clamp(MIN_SCAN_COUNT, MAX_SCAN_COUNT),
        ),
    }
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
            let budget = step_budget(step, walk);
            let done = self.step(conn, walk, step, room, &pattern, budget).await?;
            *held += done.server_time;
            batch.completed += done.completed;
            batch.expired += done.expired;
            cursor.moved.extend(done.elsewhere);
            if step.deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(batch);
            }
        }
    }

    /// One step of `walk`, removing at most `room` records, holding the server for at most
    /// `budget` (its time, and the keys it asks of `SCAN`); the keys it did not look at are
    /// the walk's pending keys again (taken out of the reply). A step that did not scan (out
    /// of room or time first) leaves the walk's cursor where it was.
    async fn step(
        &self,
        conn: &Conn,
        walk: &mut Walk,
        step: &PurgeStep,
        room: usize,
        pattern: &str,
        (budget, count): (Duration, usize),
    ) -> Result<decode::purge::PurgeStep> {
        let scan = (!walk.walked).then_some(walk.scan);
        let cmd = self.step_cmd(step, room, budget, scan, pattern, count, &walk.pending);
        let sent = Instant::now();
        let value = conn.eval_on(&walk.node, &cmd).await.map_err(backend)?;
        let mut done = decode::purge::purge_step(value).map_err(backend)?;
        walk.last_wait = sent.elapsed().saturating_sub(done.server_time);
        if let Some(next) = done.cursor {
            walk.scan = next;
            walk.walked = next == 0;
        }
        walk.pending = std::mem::take(&mut done.left);
        Ok(done)
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

    /// Purge keys whose slot moved since they were found, through the cluster client (one
    /// `lua/many.lua` call over `purge.lua` per slot, redirections followed). Rare (a slot
    /// migration), so its round trip's wall time counts as time held: the pacing can only
    /// overestimate it.
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
        let sent = Instant::now();
        let replies = conn
            .eval_batch(&PURGE_MANY, &calls, None)
            .await
            .map_err(backend)?;
        *held += sent.elapsed();
        for v in &replies.values {
            match decode::purge::purged(v) {
                Purged::Completed => batch.completed += 1,
                Purged::Expired => batch.expired += 1,
                Purged::Nothing => {}
            }
        }
        Ok(())
    }
}

impl RedisStore {
    /// `Storage::record_purge`: one script call on the run's hash.
    pub(crate) async fn record_purge_run(&self, report: &PurgeReport) -> Result<()> {
        // The script's clock gives the finish time; the run gives the rest.
        let run = PurgeRun::of(report, dedup_core::Timestamp::from_millis(0));
        let call = Call::new(&PURGE_RUN, purge_run_key(&self.config().prefix))
            .arg(self.now_arg())
            .arg(run.removed)
            .arg(run.took_ms())
            .arg(if run.stopped_early { "1" } else { "0" });
        self.conn().eval(&call).await.map_err(backend)?;
        Ok(())
    }

    /// `AdminStorage::last_purge`: `HMGET` of the run's hash.
    pub(crate) async fn last_purge_run(&self) -> Result<Option<PurgeRun>> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(purge_run_key(&self.config().prefix)).arg(&[
            "finished_at",
            "removed",
            "took_ms",
            "stopped_early",
        ]);
        let fields: (Option<i64>, Option<i64>, Option<i64>, Option<i64>) =
            self.conn().query(&cmd).await.map_err(backend)?;
        Ok(match fields {
            (Some(finished), Some(removed), Some(took), Some(early)) => {
                Some(PurgeRun::from_stored(finished, removed, took, early == 1))
            }
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use dedup_core::{ClaimOptions, DedupStore, Key, ManualClock};

    use super::*;
    use crate::RedisConfig;

    const US: Duration = Duration::from_micros(1);
    const HOUR: Duration = Duration::from_secs(3600);

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

    /// A store on `url` (a cluster if it names several nodes) with `n` records completed
    /// two hours ago by its clock: purgeable with a retention of an hour.
    async fn store_with_old_records(urls: &str, test: &str, n: usize) -> (RedisStore, Vec<Key>) {
        let clock = Arc::new(ManualClock::starting_now());
        let config = RedisConfig {
            prefix: format!(
                "t_{test}_{}_{:x}:",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos()
            ),
            retention: 24 * HOUR,
            clock: Some(clock.clone()),
            ..RedisConfig::default()
        };
        let urls: Vec<String> = urls.split(',').map(str::to_owned).collect();
        let store = match urls.len() {
            1 => RedisStore::connect_with(&urls[0], config).await,
            _ => RedisStore::connect_cluster(&urls, config).await,
        }
        .expect("connect");
        let keys: Vec<Key> = (0..n)
            .map(|i| Key::new("purge", format!("m{i}")).unwrap())
            .collect();
        for key in &keys {
            let lease = store
                .claim(key, &ClaimOptions::lease(Duration::from_secs(10)))
                .await
                .unwrap()
                .into_lease()
                .unwrap();
            store.commit(&lease, None).await.unwrap();
        }
        clock.advance(2 * HOUR);
        (store, keys)
    }

    fn purge_step(limit: usize) -> PurgeStep {
        PurgeStep {
            retention: HOUR,
            limit,
            deadline: None,
        }
    }

    /// Run `lua/purge_step.lua` on `node` with these keys pending and no scan.
    async fn run_step(
        store: &RedisStore,
        node: &ScanNode,
        room: usize,
        budget: Duration,
        keys: &[Vec<u8>],
    ) -> decode::purge::PurgeStep {
        let cmd = store.step_cmd(&purge_step(room), room, budget, None, "", 0, keys);
        let conn = store.purge_conn().await.unwrap();
        decode::purge::purge_step(conn.eval_on(node, &cmd).await.unwrap()).unwrap()
    }

    /// The step's mechanism, on the server: it stops taking keys at its budget and at its
    /// room, and hands back, in order, the keys it did not look at.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_step_stops_at_its_budget_and_room_and_hands_back_the_rest() {
        let Some(url) = dedup_conformance::server_url("DEDUP_REDIS_URL") else {
            eprintln!("SKIPPED: DEDUP_REDIS_URL is not set (see scripts/test.sh)");
            return;
        };
        let (store, keys) = store_with_old_records(&url, "step_budget", 20).await;
        let raw: Vec<Vec<u8>> = keys
            .iter()
            .map(|k| store.redis_key(k).into_bytes())
            .collect();
        let node = ScanNode::Standalone;

        // No time at all: nothing looked at, everything handed back.
        let none = run_step(&store, &node, 20, Duration::ZERO, &raw).await;
        assert_eq!((none.completed, none.cursor), (0, None));
        assert_eq!(none.left, raw);
        // Room for 5: exactly 5 removed, the rest handed back in order.
        let five = run_step(&store, &node, 5, Duration::from_secs(1), &raw).await;
        assert_eq!(five.completed, 5);
        assert_eq!(five.left, raw[5..]);
        assert!(five.elsewhere.is_empty());
        // Time and room: all the rest removed.
        let rest = run_step(&store, &node, 20, Duration::from_secs(1), &five.left).await;
        assert_eq!((rest.completed, rest.left.len()), (15, 0));
        for key in &keys {
            assert_eq!(store.get(key).await.unwrap(), None);
        }
    }

    /// A step that runs out of time before it scans leaves its walk where it was: a walk
    /// at its first step (cursor 0, which `SCAN` also answers when a walk is over) is not
    /// taken for walked, and the next steps still find and purge every record. (A first
    /// step preempted past its 50 µs floor on a loaded machine once ended whole purges
    /// early this way.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_step_out_of_time_before_it_scans_leaves_the_walk_where_it_was() {
        let Some(url) = dedup_conformance::server_url("DEDUP_REDIS_URL") else {
            eprintln!("SKIPPED: DEDUP_REDIS_URL is not set (see scripts/test.sh)");
            return;
        };
        let (store, keys) = store_with_old_records(&url, "step_no_scan", 20).await;
        let conn = store.purge_conn().await.unwrap();
        let pattern = format!("{}*", store.config().prefix);
        let mut walk = Walk::new(ScanNode::Standalone);
        let step = purge_step(1000);

        let none = store
            .step(conn, &mut walk, &step, 1000, &pattern, (Duration::ZERO, 50))
            .await
            .unwrap();
        assert_eq!((none.cursor, none.completed), (None, 0));
        assert!(!walk.walked && walk.scan == 0, "{walk:?}");

        let mut completed = 0;
        while !walk.done() {
            let budget = (Duration::from_secs(1), MAX_SCAN_COUNT);
            let done = store
                .step(conn, &mut walk, &step, 1000, &pattern, budget)
                .await
                .unwrap();
            completed += done.completed;
        }
        assert_eq!(completed, 20);
        for key in &keys {
            assert_eq!(store.get(key).await.unwrap(), None);
        }
    }

    /// In a cluster, a key found on one primary whose slot another primary owns (its slot
    /// moved since) comes back from the step untouched, and the batch purges it through the
    /// cluster client.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_whose_slot_moved_is_purged_through_the_cluster_client() {
        let Some(urls) = dedup_conformance::server_url("DEDUP_REDIS_CLUSTER_URLS") else {
            eprintln!("SKIPPED: DEDUP_REDIS_CLUSTER_URLS is not set (see scripts/test.sh)");
            return;
        };
        let (store, keys) = store_with_old_records(&urls, "step_moved", 30).await;
        let raw: Vec<Vec<u8>> = keys
            .iter()
            .map(|k| store.redis_key(k).into_bytes())
            .collect();
        let nodes = store
            .purge_conn()
            .await
            .unwrap()
            .scan_nodes()
            .await
            .unwrap();
        assert!(nodes.len() > 1, "a cluster of several primaries: {nodes:?}");

        // Every key, sent to the first primary: it purges its own and hands back the others.
        let step = run_step(&store, &nodes[0], 30, Duration::from_secs(1), &raw).await;
        assert!(step.left.is_empty());
        assert!(!step.elsewhere.is_empty(), "30 keys all on one primary?");
        assert_eq!(step.completed as usize + step.elsewhere.len(), 30);
        for key in &step.elsewhere {
            let redis_key = String::from_utf8(key.clone()).unwrap();
            let i = raw.iter().position(|r| r == key).unwrap();
            assert!(
                store.get(&keys[i]).await.unwrap().is_some(),
                "{redis_key} untouched"
            );
        }

        // A batch whose cursor holds those keys as pending on the wrong primary.
        let mut cursor = Cursor {
            walks: Some(vec![Walk {
                pending: step.elsewhere.clone(),
                walked: true,
                ..Walk::new(nodes[0].clone())
            }]),
            moved: Vec::new(),
        };
        let batch = store
            .purge_batch(&purge_step(1000), &mut cursor)
            .await
            .unwrap();
        assert_eq!(batch.completed as usize, step.elsewhere.len());
        assert!(batch.exhausted);
        for key in &keys {
            assert_eq!(store.get(key).await.unwrap(), None);
        }
    }
}
