//! Purge batches: one short write transaction each, driven by the purge indexes.

use std::time::Duration;

use async_trait::async_trait;
use dedup_core::backend::{PurgeBatch, PurgeBatches, PurgeStep};
use dedup_core::{Result, Timestamp};
use rusqlite::{Connection, params};

use crate::error::backend;
use crate::row;
use crate::store::{Inner, SqliteStore};

#[async_trait]
impl PurgeBatches for SqliteStore {
    type PurgeCursor = ();

    /// One short write transaction per batch; claims queued at the write gate go before
    /// the next batch (the gate is first come, first served).
    async fn purge_batch(&self, step: &PurgeStep, _: &mut ()) -> Result<PurgeBatch> {
        let (retention, limit) = (step.retention, step.limit);
        self.write(move |conn, inner, now| inner.purge_batch(conn, now, retention, limit))
            .await
    }
}

impl Inner {
    /// One purge batch of at most `limit` rows.
    pub(crate) fn purge_batch(
        &self,
        conn: &Connection,
        now: Timestamp,
        retention: Duration,
        limit: usize,
    ) -> Result<PurgeBatch> {
        let cutoff = now.saturating_sub(retention);
        let max_rows = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut stmt = conn
            .prepare_cached(&self.queries.purge_batch)
            .map_err(backend)?;
        let states = stmt
            .query_map(
                params![cutoff.as_millis(), now.as_millis(), max_rows],
                |row| row.get::<_, String>(0),
            )
            .map_err(backend)?;
        let mut batch = PurgeBatch::default();
        for state in states {
            if row::is_completed_state(&state.map_err(backend)?) {
                batch.completed += 1;
            } else {
                batch.expired += 1;
            }
        }
        batch.exhausted = batch.total() < limit as u64;
        Ok(batch)
    }
}
