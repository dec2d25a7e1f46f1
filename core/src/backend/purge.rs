//! The purge driver every store shares: batches, the batch limit, pacing and the report.
//!
//! A backend only knows how to remove one batch ([`PurgeBatches::purge_batch`]). The driver
//! calls it until nothing purgeable is left or [`PurgeOptions::max_batches`] ran, and in
//! between applies the [`Pace`]:
//!
//! - [`Pace::Unpaced`]: every batch asks for `batch_size` records, back to back (for
//!   maintenance windows: fastest, and every batch but the last removes exactly
//!   `batch_size`).
//! - [`Pace::Paced`] (the default): the batch limit starts small and adapts so one batch
//!   takes about `max_batch_time` at most (never more than `batch_size`), and after each
//!   batch the purge rests so it is busy at most `busy_percent` of the time. Live traffic
//!   therefore never waits behind more than one short batch, and gets the storage to itself
//!   most of the time.

use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::{Pace, PurgeOptions, PurgeReport, Result};

/// How a backend removes one batch of purgeable records; [`run`] drives the batches.
#[async_trait]
pub trait PurgeBatches: Send + Sync {
    /// The backend's resume state between batches (a keyset position, a scan cursor);
    /// `()` when each batch starts afresh.
    type PurgeCursor: Default + Send;

    /// Remove at most `step.limit` purgeable records (see
    /// [`transition::purgeable`](crate::backend::transition::purgeable)), continuing from `cursor`,
    /// as one short unit of work (one statement, transaction or pipeline). A backend that
    /// works in several round trips stops at `step.deadline` when it has one.
    async fn purge_batch(
        &self,
        step: &PurgeStep,
        cursor: &mut Self::PurgeCursor,
    ) -> Result<PurgeBatch>;
}

/// Smallest batch the paced driver shrinks to, and where it starts.
///
/// Every batch has a fixed cost besides its rows (a commit and its flush on SQLite, a round
/// trip, a `SCAN` step on Redis). When that fixed cost alone is near the time bound, a
/// floor much below this left batches of a dozen rows, each followed by a rest three times
/// as long, and the purge crawled (about 3 000 rows/s on a Redis Cluster, under the 5 000 a
/// cleanup job must keep). Removing 64 records holds any backend well under a millisecond.
const MIN_PACED_LIMIT: usize = 64;

/// What one batch may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PurgeStep {
    /// Remove records older than this (see [`PurgeOptions::retention`]).
    pub retention: Duration,
    /// Remove at most this many records.
    pub limit: usize,
    /// Stop at this instant if the batch takes several round trips (paced purges only).
    pub deadline: Option<Instant>,
}

/// What one batch removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PurgeBatch {
    /// Completed records removed.
    pub completed: u64,
    /// Expired in-flight records removed.
    pub expired: u64,
    /// Whether the backend found nothing more to remove (for a single-statement batch:
    /// it removed fewer than `limit`).
    pub exhausted: bool,
    /// How long the batch kept the storage busy (its transaction, its statements or round
    /// trips), when the backend measured that apart from the time it waited for a
    /// connection or for its turn behind live traffic. Pacing sizes batches and rests on
    /// this: under load, waiting for a turn is not work, and counting it would shrink the
    /// batches and lengthen the rests until the purge barely runs. `None`: the whole call
    /// counts.
    pub work: Option<Duration>,
}

impl PurgeBatch {
    /// Records removed.
    pub fn total(&self) -> u64 {
        self.completed + self.expired
    }
}

/// Run a purge over `store`'s batches: checks `options` ([`check::purge`]), then batches
/// until the backend is exhausted or `max_batches` ran (then
/// [`PurgeReport::stopped_early`]), paced as `options.pace` says.
///
/// [`check::purge`]: super::check::purge
pub async fn run<S: PurgeBatches + ?Sized>(
    store: &S,
    options: &PurgeOptions,
) -> Result<PurgeReport> {
    super::check::purge(options)?;
    let started = Instant::now();
    let mut report = PurgeReport::default();
    let mut cursor = S::PurgeCursor::default();
    let mut limit = match options.pace {
        Pace::Unpaced => options.batch_size,
        Pace::Paced { .. } => options.batch_size.min(MIN_PACED_LIMIT),
    };
    loop {
        if options.max_batches.is_some_and(|max| report.batches >= max) {
            report.stopped_early = true;
            break;
        }
        let batch_start = Instant::now();
        let step = PurgeStep {
            retention: options.retention,
            limit,
            deadline: match options.pace {
                Pace::Unpaced => None,
                Pace::Paced { max_batch_time, .. } => Some(batch_start + max_batch_time),
            },
        };
        let batch = store.purge_batch(&step, &mut cursor).await?;
        let took = batch.work.unwrap_or_else(|| batch_start.elapsed());
        report.batches += 1;
        report.completed += batch.completed;
        report.expired += batch.expired;
        if batch.exhausted {
            break;
        }
        if let Pace::Paced {
            max_batch_time,
            busy_percent,
        } = options.pace
        {
            limit = next_limit(
                limit,
                batch.total(),
                took,
                max_batch_time,
                options.batch_size,
            );
            tokio::time::sleep(rest_after(took, busy_percent)).await;
        }
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

/// The next paced batch limit: shrink in proportion when a batch overran the time bound,
/// double when a full batch took less than half of it.
fn next_limit(
    limit: usize,
    removed: u64,
    took: Duration,
    max_batch_time: Duration,
    batch_size: usize,
) -> usize {
    let floor = MIN_PACED_LIMIT.min(batch_size);
    if took > max_batch_time {
        let scaled = limit as f64 * max_batch_time.as_secs_f64() / took.as_secs_f64();
        (scaled as usize).clamp(floor, batch_size)
    } else if took < max_batch_time / 2 && removed >= limit as u64 {
        limit.saturating_mul(2).clamp(floor, batch_size)
    } else {
        limit
    }
}

/// How long to rest after a batch that took `took`, so the purge is busy at most
/// `busy_percent` of the time.
fn rest_after(took: Duration, busy_percent: u8) -> Duration {
    let busy = f64::from(busy_percent.clamp(1, 100)) / 100.0;
    took.mul_f64((1.0 - busy) / busy)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_slow_batch_shrinks_the_next_in_proportion() {
        assert_eq!(next_limit(1000, 1000, 10 * MS, 2 * MS, 5000), 200);
        // Never below the floor, never above batch_size.
        assert_eq!(next_limit(80, 80, 100 * MS, 2 * MS, 5000), MIN_PACED_LIMIT);
        assert_eq!(next_limit(8, 8, 100 * MS, 2 * MS, 8), 8);
    }

    #[test]
    fn a_quick_full_batch_doubles_the_next_up_to_batch_size() {
        assert_eq!(next_limit(100, 100, MS / 2, 2 * MS, 5000), 200);
        assert_eq!(next_limit(4000, 4000, MS / 2, 2 * MS, 5000), 5000);
        // A short batch (nothing more to take) or one near the bound keeps its limit.
        assert_eq!(next_limit(100, 40, MS / 2, 2 * MS, 5000), 100);
        assert_eq!(next_limit(100, 100, 3 * MS / 2, 2 * MS, 5000), 100);
    }

    #[test]
    fn only_a_batch_over_the_bound_shrinks_and_only_one_under_half_of_it_grows() {
        // Exactly the bound: kept (a proportional shrink by 1.0 would round 2001 down).
        assert_eq!(next_limit(2001, 2001, MS, MS, 5000), 2001);
        // Exactly half the bound: kept, not doubled.
        assert_eq!(next_limit(100, 100, MS, 2 * MS, 5000), 100);
    }

    /// A store that records, for its one batch, how far ahead its deadline was.
    #[derive(Default)]
    struct Deadline(std::sync::Mutex<Option<Option<Duration>>>);

    #[async_trait]
    impl PurgeBatches for Deadline {
        type PurgeCursor = ();

        async fn purge_batch(&self, step: &PurgeStep, _: &mut ()) -> Result<PurgeBatch> {
            let ahead = step
                .deadline
                .map(|d| d.saturating_duration_since(Instant::now()));
            *self.0.lock().unwrap() = Some(ahead);
            Ok(PurgeBatch {
                exhausted: true,
                ..PurgeBatch::default()
            })
        }
    }

    #[tokio::test]
    async fn a_paced_batch_must_end_within_the_bound_and_an_unpaced_one_has_no_deadline() {
        let paced = PurgeOptions::older_than(Duration::from_secs(1)).pace(Pace::Paced {
            max_batch_time: Duration::from_secs(10),
            busy_percent: 25,
        });
        let store = Deadline::default();
        run(&store, &paced).await.unwrap();
        let ahead = store.0.lock().unwrap().unwrap().expect("a deadline");
        assert!(ahead > Duration::from_secs(5) && ahead <= Duration::from_secs(10));

        let store = Deadline::default();
        run(&store, &paced.unpaced()).await.unwrap();
        assert_eq!(*store.0.lock().unwrap(), Some(None));
    }

    #[test]
    fn a_batch_removed_its_completed_and_expired_records() {
        let batch = PurgeBatch {
            completed: 2,
            expired: 3,
            ..PurgeBatch::default()
        };
        assert_eq!(batch.total(), 5);
    }

    /// A store whose batches each take `wall` of the caller's time but report `work` of
    /// storage time (the rest: waiting for a turn), removing what they are asked for.
    struct Queued {
        wall: Duration,
        work: Option<Duration>,
        left: std::sync::Mutex<u64>,
        limits: std::sync::Mutex<Vec<usize>>,
    }

    #[async_trait]
    impl PurgeBatches for Queued {
        type PurgeCursor = ();

        async fn purge_batch(&self, step: &PurgeStep, _: &mut ()) -> Result<PurgeBatch> {
            tokio::time::sleep(self.wall).await;
            self.limits.lock().unwrap().push(step.limit);
            let mut left = self.left.lock().unwrap();
            let removed = (*left).min(step.limit as u64);
            *left -= removed;
            Ok(PurgeBatch {
                completed: removed,
                exhausted: removed < step.limit as u64,
                work: self.work,
                ..PurgeBatch::default()
            })
        }
    }

    async fn limits_asked(work: Option<Duration>, records: u64) -> (Vec<usize>, PurgeReport) {
        let store = Queued {
            wall: 10 * MS,
            work,
            left: std::sync::Mutex::new(records),
            limits: std::sync::Mutex::default(),
        };
        let report = run(&store, &PurgeOptions::older_than(Duration::from_secs(1)))
            .await
            .unwrap();
        (store.limits.into_inner().unwrap(), report)
    }

    #[tokio::test]
    async fn a_purge_stops_early_after_its_batch_limit() {
        let store = Queued {
            wall: Duration::ZERO,
            work: None,
            left: std::sync::Mutex::new(1000),
            limits: std::sync::Mutex::default(),
        };
        let options = PurgeOptions::older_than(Duration::from_secs(1))
            .unpaced()
            .batch_size(100)
            .max_batches(2);
        let report = run(&store, &options).await.unwrap();
        assert_eq!(
            (report.batches, report.completed, report.stopped_early),
            (2, 200, true)
        );
    }

    #[tokio::test]
    async fn pacing_counts_the_reported_work_not_the_wait_for_a_turn() {
        // Each call waits 10 ms for its turn but holds the storage 0.1 ms: batches grow to
        // the default batch_size.
        let (limits, report) = limits_asked(Some(MS / 10), 2000).await;
        assert_eq!(&limits[..5], &[64, 128, 256, 512, 1000], "{limits:?}");
        assert_eq!(report.completed, 2000);
        // Rests follow the work (3 x 0.1 ms per batch at 25 % busy), not the 10 ms calls.
        assert!(report.elapsed < 15 * MS * limits.len() as u32, "{report:?}");

        // Without a measured work time the whole 10 ms call counts: past the 1 ms bound,
        // batches stay at the floor and each call is followed by a 30 ms rest.
        let (limits, report) = limits_asked(None, 200).await;
        assert_eq!(limits, vec![MIN_PACED_LIMIT; 4]);
        assert_eq!(report.completed, 200);
        assert!(
            report.elapsed >= 40 * MS * (limits.len() as u32 - 1),
            "{report:?}"
        );
    }

    #[test]
    fn rest_keeps_the_busy_share() {
        assert_eq!(rest_after(2 * MS, 25), 6 * MS);
        assert_eq!(rest_after(2 * MS, 50), 2 * MS);
        assert_eq!(rest_after(2 * MS, 100), Duration::ZERO);
        assert_eq!(rest_after(2 * MS, 0), 198 * MS);
    }
}
