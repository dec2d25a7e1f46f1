//! Purge batches: bounded keyset walks of the `claimed_at` index (the cursor and the
//! tally are [`dedup_sql::purge`]'s; the statements are this backend's).

use std::time::Instant;

use async_trait::async_trait;
use dedup_core::Result;
use dedup_core::backend::{PurgeBatch, PurgeBatches, PurgeStep};
use dedup_sql::purge::Cursor;

use crate::PostgresStore;
use crate::error::backend;
use dedup_sql::purge::retention_ms;

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
            .bind(retention_ms(step.retention))
            .bind(limit)
            .bind(cursor.claimed_from())
            .fetch_all(&mut *conn)
            .await
            .map_err(backend)?;
        let work = started.elapsed();
        let (mut batch, next) = cursor.tally(&rows, step).map_err(backend)?;
        *cursor = next;
        batch.work = Some(work);
        Ok(batch)
    }
}
