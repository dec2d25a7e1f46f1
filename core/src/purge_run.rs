//! [`PurgeRun`]: the last purge a store ran, as the store keeps it for every process to read.

use std::time::Duration;

use crate::{PurgeReport, Timestamp};

/// The last purge of a store's records that finished, as the store keeps it: written by
/// every [`DedupStore::purge`](crate::DedupStore::purge) that finishes (a
/// [`Purger`](crate::Purger)'s run, `dedup purge`, the console's "purge now", whichever
/// process ran it), read with [`Admin::last_purge`](crate::Admin::last_purge). It answers
/// "when did cleanup last run, and did it keep up": a run that
/// [`stopped_early`](Self::stopped_early) left records it could have removed.
///
/// One per store (per records table on the SQL backends, per key prefix on Redis): the run
/// that finished last replaces the one before it. A purge that failed is not recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PurgeRun {
    /// When it finished, by the store's clock.
    pub finished_at: Timestamp,
    /// Records it removed (completed and expired in-flight ones).
    pub removed: u64,
    /// How long it took, rests between paced batches included, in whole milliseconds (as
    /// every store keeps it).
    pub took: Duration,
    /// Whether it stopped at its batch limit with records possibly left
    /// ([`PurgeReport::stopped_early`]).
    pub stopped_early: bool,
}

impl PurgeRun {
    /// The run `report` describes, finished at `finished_at` (the store's "now" when it
    /// was recorded); its time cut to whole milliseconds.
    pub fn of(report: &PurgeReport, finished_at: Timestamp) -> Self {
        PurgeRun {
            finished_at,
            removed: report.total(),
            took: Duration::from_millis(
                u64::try_from(report.elapsed.as_millis()).unwrap_or(u64::MAX),
            ),
            stopped_early: report.stopped_early,
        }
    }

    /// When it started: [`finished_at`](Self::finished_at) less [`took`](Self::took).
    pub fn started_at(&self) -> Timestamp {
        self.finished_at.saturating_sub(self.took)
    }

    /// [`took`](Self::took) in whole milliseconds, as the stores keep it.
    pub fn took_ms(&self) -> i64 {
        i64::try_from(self.took.as_millis()).unwrap_or(i64::MAX)
    }

    /// A run as a store reads it back: `finished_ms` and `took_ms` in milliseconds (a
    /// negative count or duration, which no store writes, reads as zero).
    pub fn from_stored(finished_ms: i64, removed: i64, took_ms: i64, stopped_early: bool) -> Self {
        PurgeRun {
            finished_at: Timestamp::from_millis(finished_ms),
            removed: u64::try_from(removed).unwrap_or(0),
            took: Duration::from_millis(u64::try_from(took_ms).unwrap_or(0)),
            stopped_early,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_becomes_a_run_and_reads_back_the_same() {
        let report = PurgeReport {
            completed: 7,
            expired: 2,
            batches: 3,
            elapsed: Duration::from_millis(1500),
            stopped_early: true,
        };
        let run = PurgeRun::of(&report, Timestamp::from_millis(10_000));
        assert_eq!(run.removed, 9);
        assert_eq!(run.started_at(), Timestamp::from_millis(8_500));
        assert_eq!(
            PurgeRun::from_stored(10_000, 9, run.took_ms(), true),
            run,
            "what a store writes reads back unchanged"
        );
        assert_eq!(PurgeRun::from_stored(0, -1, -5, false).removed, 0);
    }
}
