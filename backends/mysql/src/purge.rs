//! Purge batches: bounded keyset walks of the `claimed_at` index (the cursor and the
//! tally are [`dedup_sql::purge`]'s; the statements are this backend's); and the
//! statements keeping the last purge run ([`dedup_sql::purge_run`] runs them).

use std::time::Instant;

use async_trait::async_trait;
use dedup_core::backend::{PurgeBatch, PurgeBatches, PurgeStep};
use dedup_core::{PurgeReport, PurgeRun, Result};
use dedup_sql::config::PURGE_RUNS_TABLE;
use dedup_sql::purge::{Cursor, retention_ms};
use dedup_sql::purge_run;
use sqlx::mysql::MySqlArguments;
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, MySql, Row};

use crate::MySqlStore;
use crate::error::{backend, lost_race};
use crate::statements::{BEGIN, CUTOFF_USES, NOW_MS};

/// Keep a run as its table's last, replacing the one before. Parameters: now, table,
/// removed, took in ms, stopped early.
fn record_run_sql() -> String {
    format!(
        "INSERT INTO {PURGE_RUNS_TABLE} \
         (finished_at, table_name, removed, took_ms, stopped_early) VALUES ({NOW_MS}, ?, ?, ?, ?) \
         ON DUPLICATE KEY UPDATE finished_at = VALUES(finished_at), removed = VALUES(removed), \
         took_ms = VALUES(took_ms), stopped_early = VALUES(stopped_early)"
    )
}

/// A table's last run, by the primary key. Parameter: table.
const LAST_RUN: &str = "SELECT finished_at, removed, took_ms, stopped_early \
     FROM dedup_purge_runs WHERE table_name = ?";

impl MySqlStore {
    /// `Storage::record_purge`: one upsert of the table's row, stamped with the store's
    /// "now".
    pub(crate) async fn record_purge_run(&self, report: &PurgeReport) -> Result<()> {
        purge_run::record_run(self, AssertSqlSafe(record_run_sql()), report).await
    }

    /// `AdminStorage::last_purge`: the table's row.
    pub(crate) async fn last_purge_run(&self) -> Result<Option<PurgeRun>> {
        purge_run::last_run(self, LAST_RUN).await
    }
}

#[async_trait]
impl PurgeBatches for MySqlStore {
    type PurgeCursor = Cursor;

    /// On MariaDB, one statement: `DELETE ... ORDER BY claimed_at LIMIT n RETURNING`, in
    /// its own (autocommit) transaction. On MySQL, which has no `DELETE ... RETURNING`, and
    /// on a Galera node (see `purges_with_returning`), one transaction: the batch's victims
    /// read and locked (`FOR UPDATE SKIP LOCKED`, at most `step.limit`), deleted by primary
    /// key, committed. Its work time is the statement's or the transaction's, without the
    /// wait for a pooled connection.
    ///
    /// Concurrent purgers and claimers can deadlock on InnoDB's index locks; the loser's
    /// statement or transaction was rolled back whole (nothing deleted, the cursor
    /// unmoved), so the batch runs again after a short pause, up to 10 times in all
    /// (`BATCH_TRIES`).
    async fn purge_batch(&self, step: &PurgeStep, cursor: &mut Cursor) -> Result<PurgeBatch> {
        let mut tries = 1;
        loop {
            let once = match self.purges_with_returning().await {
                Ok(true) => self.purge_batch_returning(step, cursor).await,
                Ok(false) => self.purge_batch_locked(step, cursor).await,
                Err(e) => Err(e),
            };
            match once {
                Err(e) if lost_race(&e) && tries < BATCH_TRIES => {
                    tokio::time::sleep(std::time::Duration::from_millis(5 * u64::from(tries)))
                        .await;
                    tries += 1;
                }
                done => return done.map_err(backend),
            }
        }
    }
}

/// How many times a purge batch runs when it loses a race (see `purge_batch`).
const BATCH_TRIES: u32 = 10;

impl MySqlStore {
    /// The purge statements' parameters: the cutoff's now and retention (see
    /// `CUTOFF_USES`), the cursor, the limit.
    fn purge_query<'q>(
        &self,
        sql: &str,
        step: &PurgeStep,
        cursor: &Cursor,
    ) -> Query<'q, MySql, MySqlArguments> {
        let limit = i64::try_from(step.limit).unwrap_or(i64::MAX);
        let mut query = sqlx::query(AssertSqlSafe(sql.to_owned()));
        for _ in 0..CUTOFF_USES {
            query = query
                .bind(self.now_param())
                .bind(retention_ms(step.retention));
        }
        query.bind(cursor.claimed_from()).bind(limit)
    }

    /// One batch as one `DELETE ... RETURNING` (MariaDB).
    async fn purge_batch_returning(
        &self,
        step: &PurgeStep,
        cursor: &mut Cursor,
    ) -> std::result::Result<PurgeBatch, sqlx::Error> {
        let mut conn = self.pool().acquire().await?;
        let started = Instant::now();
        let rows = self
            .purge_query(&self.statements().purge_delete, step, cursor)
            .fetch_all(&mut *conn)
            .await?;
        let work = started.elapsed();
        let (mut batch, next) = cursor.tally(&rows, step)?;
        *cursor = next;
        batch.work = Some(work);
        Ok(batch)
    }

    /// One batch as one transaction (MySQL; see `purge_batch`).
    async fn purge_batch_locked(
        &self,
        step: &PurgeStep,
        cursor: &mut Cursor,
    ) -> std::result::Result<PurgeBatch, sqlx::Error> {
        let mut conn = self.pool().acquire().await?;
        let started = Instant::now();
        let mut tx = sqlx::Connection::begin_with(&mut *conn, BEGIN).await?;
        let rows = self
            .purge_query(&self.statements().purge_select, step, cursor)
            .fetch_all(&mut *tx)
            .await?;
        let (mut batch, next) = cursor.tally(&rows, step)?;
        let mut keys = Vec::with_capacity(rows.len());
        for row in &rows {
            let consumer: Vec<u8> = row.try_get("consumer")?;
            let message_id: Vec<u8> = row.try_get("message_id")?;
            keys.push((consumer, message_id));
        }
        for chunk in keys.chunks(1000) {
            let mut query = sqlx::query(AssertSqlSafe(self.statements().delete(chunk.len())));
            for (consumer, message_id) in chunk {
                query = query.bind(consumer).bind(message_id);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        *cursor = next;
        batch.work = Some(started.elapsed());
        Ok(batch)
    }
}
