//! Purge batches: bounded keyset walks of the `claimed_at` index (the cursor and the
//! tally are [`dedup_sql::purge`]'s; the statements are this backend's); and the last
//! purge run, one row per records table in the schema's [`PURGE_RUNS_TABLE`].

use std::time::Instant;

use async_trait::async_trait;
use dedup_core::backend::{PurgeBatch, PurgeBatches, PurgeStep};
use dedup_core::{PurgeReport, PurgeRun, Result};
use dedup_sql::config::PURGE_RUNS_TABLE;
use dedup_sql::purge::{Cursor, retention_ms};
use dedup_sql::purge_run;
use sqlx::AssertSqlSafe;

use crate::PostgresStore;
use crate::error::backend;
use crate::statements::{ASYNC_COMMIT_CTE, NOW_MS};

#[async_trait]
impl PurgeBatches for PostgresStore {
    type PurgeCursor = Cursor;

    /// One statement deleting at most `step.limit` purgeable rows. Its work time is the
    /// statement's round trip, without the wait for a pooled connection.
    async fn purge_batch(&self, step: &PurgeStep, cursor: &mut Cursor) -> Result<PurgeBatch> {
        if let Some(partitions) = &self.config().partitions {
            return self.retire_batch(partitions, step).await;
        }
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

impl PostgresStore {
    /// The schema's purge runs table, quoted.
    fn purge_runs(&self) -> String {
        format!("\"{}\".{PURGE_RUNS_TABLE}", self.config().schema)
    }

    /// `Storage::record_purge`: one upsert of the table's row, stamped with the store's
    /// "now" (`$1`), committed without waiting for its log flush like the batches it
    /// reports (`ASYNC_COMMIT_CTE`: a crash may lose the last run's row, never a record).
    pub(crate) async fn record_purge_run(&self, report: &PurgeReport) -> Result<()> {
        let sql = format!(
            "WITH {ASYNC_COMMIT_CTE} \
             INSERT INTO {runs} (table_name, finished_at, removed, took_ms, stopped_early) \
             SELECT $2, {NOW_MS}, $3, $4, $5 FROM async_commit \
             ON CONFLICT (table_name) DO UPDATE SET finished_at = excluded.finished_at, \
             removed = excluded.removed, took_ms = excluded.took_ms, \
             stopped_early = excluded.stopped_early",
            runs = self.purge_runs()
        );
        purge_run::record_run(self, AssertSqlSafe(sql), report).await
    }

    /// `AdminStorage::last_purge`: the table's row, by the primary key.
    pub(crate) async fn last_purge_run(&self) -> Result<Option<PurgeRun>> {
        let sql = format!(
            "SELECT finished_at, removed, took_ms, stopped_early FROM {runs} \
             WHERE table_name = $1",
            runs = self.purge_runs()
        );
        purge_run::last_run(self, AssertSqlSafe(sql)).await
    }
}
