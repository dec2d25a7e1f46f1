//! Purge batches as bounded keyset walks of the `claimed_at` index: the cursor between
//! batches and the count of what a batch removed, the same on every sqlx backend. The
//! statements that take the batch are each backend's.

use std::time::Duration;

use dedup_core::backend::{PurgeBatch, PurgeStep};
use dedup_core::duration_millis;
use sqlx::{ColumnIndex, Decode, Row, Type};

/// A retention as the purge statements bind it: in ms, capped far below `i64::MAX` so
/// that "now" minus it cannot overflow in SQL.
pub fn retention_ms(retention: Duration) -> i64 {
    duration_millis(retention).min(i64::MAX / 4)
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
