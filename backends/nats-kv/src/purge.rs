//! One purge batch, and the store's last purge run.
//!
//! The server's per-message TTL removes records after the retention by itself, so a purge
//! is needed only for a shorter retention. A batch walks the store's records in stream
//! order from its cursor (the next sequence), one read each, and removes each purgeable
//! one by deleting that exact message: a record written since is a newer message, and its
//! old one is already gone, so the delete removes nothing (the check and the removal are
//! one step on the server).
//!
//! A run walks to the stream's last sequence as it was at the run's first batch. Records
//! written after that are not the run's: without the bound, a steady stream of claims
//! would keep a run walking behind them and never let it finish.

use async_trait::async_trait;
use dedup_core::backend::transition::{Purgeable, purgeable};
use dedup_core::backend::{PurgeBatch, PurgeBatches, PurgeStep};
use dedup_core::{PurgeReport, PurgeRun, Result};
use serde::{Deserialize, Serialize};

use crate::NatsKvStore;
use crate::error::unreadable;

/// The last purge run, as stored (JSON) at the store's `purge-run` key.
#[derive(Serialize, Deserialize)]
struct StoredRun {
    finished_at: i64,
    removed: i64,
    took_ms: i64,
    stopped_early: bool,
}

/// Where a purge run is in its walk of the stream, between batches.
#[derive(Debug, Default)]
pub struct Cursor {
    /// The next stream sequence to look at.
    next: u64,
    /// The stream's last sequence at the run's first batch: where the run ends.
    end: Option<u64>,
}

#[async_trait]
impl PurgeBatches for NatsKvStore {
    type PurgeCursor = Cursor;

    async fn purge_batch(&self, step: &PurgeStep, cursor: &mut Cursor) -> Result<PurgeBatch> {
        let now = self.now().await?;
        let end = match cursor.end {
            Some(end) => end,
            None => *cursor.end.insert(self.messages().last_sequence().await?),
        };
        let filter = self.subjects().all_records();
        let mut batch = PurgeBatch::default();
        while batch.total() < step.limit as u64 {
            if step
                .deadline
                .is_some_and(|d| std::time::Instant::now() >= d)
            {
                return Ok(batch);
            }
            let found = if cursor.next > end {
                None
            } else {
                self.messages().next(&filter, cursor.next).await?
            };
            let Some(stored) = found.filter(|s| s.revision <= end) else {
                batch.exhausted = true;
                return Ok(batch);
            };
            cursor.next = stored.revision + 1;
            let Some(key) = self.subjects().key_of(&stored.subject) else {
                continue;
            };
            // A value that is no record is left alone (`get` reports it).
            let Ok(Some(record)) = self.record_of(&key, &stored) else {
                continue;
            };
            let Some(why) = purgeable(&record, now, step.retention) else {
                continue;
            };
            if self.messages().remove(stored.revision).await? {
                match why {
                    Purgeable::Completed => batch.completed += 1,
                    Purgeable::Expired => batch.expired += 1,
                }
            }
        }
        Ok(batch)
    }
}

impl NatsKvStore {
    /// `Storage::record_purge`: the run at the store's "now", replacing the last one.
    pub(crate) async fn record_purge_run(&self, report: &PurgeReport) -> Result<()> {
        let run = PurgeRun::of(report, self.now().await?);
        let stored = StoredRun {
            finished_at: run.finished_at.as_millis(),
            removed: i64::try_from(run.removed).unwrap_or(i64::MAX),
            took_ms: run.took_ms(),
            stopped_early: run.stopped_early,
        };
        let value = serde_json::to_vec(&stored).map_err(|_| unreadable("purge run"))?;
        self.messages()
            .overwrite(&self.subjects().purge_run(), value)
            .await
    }

    /// `AdminStorage::last_purge`.
    pub(crate) async fn last_purge_run(&self) -> Result<Option<PurgeRun>> {
        let stored = self.messages().read(&self.subjects().purge_run()).await?;
        let Some(value) = stored.and_then(|s| s.value) else {
            return Ok(None);
        };
        let run: StoredRun = serde_json::from_slice(&value).map_err(|_| unreadable("purge run"))?;
        Ok(Some(PurgeRun::from_stored(
            run.finished_at,
            run.removed,
            run.took_ms,
            run.stopped_early,
        )))
    }
}
