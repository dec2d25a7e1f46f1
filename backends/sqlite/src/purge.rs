//! Purge batches: one short write transaction each, driven by the purge indexes.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use dedup_core::backend::{PurgeBatch, PurgeBatches, PurgeStep};
use dedup_core::{Result, Timestamp};
use rusqlite::{Connection, params};

use crate::decode;
use crate::error::backend;
use crate::store::{Inner, SqliteStore};
use crate::writes::in_transaction;

#[async_trait]
impl PurgeBatches for SqliteStore {
    type PurgeCursor = ();

    /// One short write transaction per batch, never grouped with other writes: it takes
    /// the store's write gate like a group of writes does (first come, first served), so
    /// writes queued behind one batch go before the next. Its work time is the
    /// transaction's, from `BEGIN` to the durable commit, without the wait for the gate.
    async fn purge_batch(&self, step: &PurgeStep, _: &mut ()) -> Result<PurgeBatch> {
        let (retention, limit) = (step.retention, step.limit);
        self.run(true, move |conn, inner| {
            let started = Instant::now();
            let mut batch = in_transaction(conn, |tx| {
                inner.purge_batch(tx, inner.clock.now(), retention, limit)
            })?;
            batch.work = Some(started.elapsed());
            Ok(batch)
        })
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
            .prepare_cached(&self.statements.purge_batch)
            .map_err(backend)?;
        let states = stmt
            .query_map(
                params![cutoff.as_millis(), now.as_millis(), max_rows],
                |row| row.get::<_, String>(0),
            )
            .map_err(backend)?;
        let mut batch = PurgeBatch::default();
        for state in states {
            if decode::is_completed_state(&state.map_err(backend)?) {
                batch.completed += 1;
            } else {
                batch.expired += 1;
            }
        }
        batch.exhausted = batch.total() < limit as u64;
        Ok(batch)
    }
}
