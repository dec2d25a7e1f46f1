//! Purge batches: bounded keyset walks of the `claimed_at` index.

use std::time::Instant;

use async_trait::async_trait;
use dedup_core::Result;
use dedup_core::backend::{PurgeBatch, PurgeBatches, PurgeStep};
use sqlx::Row;

use crate::PostgresStore;
use crate::error::backend;
use crate::statements::retention_param;

/// Where the next batch starts in the `claimed_at` index: the largest `claimed_at` the
/// previous batches removed. Rows a batch skipped because another transaction held them
/// (`SKIP LOCKED`), with earlier claims, are left to that holder (another purger deletes
/// them) or to the next purge.
#[derive(Debug)]
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

#[async_trait]
impl PurgeBatches for PostgresStore {
    type PurgeCursor = Cursor;

    /// One statement deleting at most `step.limit` purgeable rows. Its work time is the
    /// statement's round trip, without the wait for a pooled connection.
    async fn purge_batch(&self, step: &PurgeStep, cursor: &mut Cursor) -> Result<PurgeBatch> {
        let limit = i64::try_from(step.limit).unwrap_or(i64::MAX);
        let mut conn = self.pool().acquire().await.map_err(backend)?;
        let started = Instant::now();
        let rows = sqlx::query(self.statements().purge_batch.clone())
            .bind(self.now_param())
            .bind(retention_param(step.retention))
            .bind(limit)
            .bind(cursor.claimed_from)
            .fetch_all(&mut *conn)
            .await
            .map_err(backend)?;
        let mut batch = PurgeBatch {
            exhausted: rows.len() < step.limit,
            work: Some(started.elapsed()),
            ..PurgeBatch::default()
        };
        for row in &rows {
            let processed_at: Option<i64> = row.try_get("processed_at").map_err(backend)?;
            let claimed_at: i64 = row.try_get("claimed_at").map_err(backend)?;
            cursor.claimed_from = cursor.claimed_from.max(claimed_at);
            match processed_at {
                Some(_) => batch.completed += 1,
                None => batch.expired += 1,
            }
        }
        Ok(batch)
    }
}
