//! Purge batches as bounded keyset walks of the `claimed_at` index: the cursor between
//! batches and the count of what a batch removed, the same on every sqlx backend; and the
//! last purge run read back from its row. The statements are each backend's.

use dedup_core::PurgeRun;
use dedup_core::backend::{PurgeBatch, PurgeStep};
use sqlx::{ColumnIndex, Decode, Row, Type};

/// The last purge run from a row of the purge runs table (columns `finished_at`,
/// `removed`, `took_ms`, `stopped_early`; see
/// [`PURGE_RUNS_TABLE`](crate::config::PURGE_RUNS_TABLE)).
pub fn decode_run<R>(row: &R) -> Result<PurgeRun, sqlx::Error>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(PurgeRun::from_stored(
        row.try_get("finished_at")?,
        row.try_get("removed")?,
        row.try_get("took_ms")?,
        row.try_get("stopped_early")?,
    ))
}

/// Where the next batch starts in the `claimed_at` index: the largest `claimed_at` the
/// previous batches removed. Rows a batch skipped because another transaction held them
/// (`SKIP LOCKED`), with earlier claims, are left to that holder (another purger deletes
/// them) or to the next purge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    claimed_from: i64,
}

impl Default for Cursor {
    fn default() -> Self {
        Cursor {
            claimed_from: i64::MIN,
        }
    }
}

impl Cursor {
    /// The `claimed_at` the next batch starts from (bound as the statement's cursor).
    pub fn claimed_from(&self) -> i64 {
        self.claimed_from
    }

    /// What one batch removed, as its `rows` tell (columns `processed_at` and
    /// `claimed_at`; `exhausted` when fewer than `step.limit`), and the cursor after it.
    /// This cursor is left as it is, so a batch whose transaction then fails does not
    /// move it.
    pub fn tally<R>(
        &self,
        rows: &[R],
        step: &PurgeStep,
    ) -> Result<(PurgeBatch, Cursor), sqlx::Error>
    where
        R: Row,
        for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
        for<'n> &'n str: ColumnIndex<R>,
    {
        let mut batch = PurgeBatch {
            exhausted: rows.len() < step.limit,
            ..PurgeBatch::default()
        };
        let mut claimed_from = self.claimed_from;
        for row in rows {
            let processed_at: Option<i64> = row.try_get("processed_at")?;
            let claimed_at: i64 = row.try_get("claimed_at")?;
            claimed_from = claimed_from.max(claimed_at);
            match processed_at {
                Some(_) => batch.completed += 1,
                None => batch.expired += 1,
            }
        }
        Ok((batch, Cursor { claimed_from }))
    }
}
