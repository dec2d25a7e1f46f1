//! Purge batches: one short write transaction each, driven by the purge indexes; and the
//! last purge run, one row per records table in [`PURGE_RUNS_TABLE`].

use std::time::{Duration, Instant};

use async_trait::async_trait;
use dedup_core::backend::{PurgeBatch, PurgeBatches, PurgeStep};
use dedup_core::{PurgeReport, PurgeRun, Result, Timestamp};
use rusqlite::{Connection, OptionalExtension, params};

use crate::config::PURGE_RUNS_TABLE;

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

/// Keep a run (?1 table, ?2 finished at, ?3 removed, ?4 took in ms, ?5 stopped early) as the
/// table's last, replacing the one before.
const RECORD_RUN: &str = "INSERT INTO {runs} \
     (table_name, finished_at, removed, took_ms, stopped_early) VALUES (?1, ?2, ?3, ?4, ?5) \
     ON CONFLICT (table_name) DO UPDATE SET finished_at = excluded.finished_at, \
     removed = excluded.removed, took_ms = excluded.took_ms, \
     stopped_early = excluded.stopped_early";

/// The table's (?1) last run: one row by the primary key.
const LAST_RUN: &str =
    "SELECT finished_at, removed, took_ms, stopped_early FROM {runs} WHERE table_name = ?1";

fn runs_sql(template: &str) -> String {
    template.replace("{runs}", PURGE_RUNS_TABLE)
}

impl SqliteStore {
    /// `Storage::record_purge`: one write of the store's queue, stamped with its "now".
    pub(crate) async fn record_purge_run(&self, report: &PurgeReport) -> Result<()> {
        let report = *report;
        self.write(move |conn, inner, now| {
            let run = PurgeRun::of(&report, now);
            let removed = i64::try_from(run.removed).unwrap_or(i64::MAX);
            conn.prepare_cached(&runs_sql(RECORD_RUN))
                .and_then(|mut stmt| {
                    stmt.execute(params![
                        inner.table,
                        run.finished_at.as_millis(),
                        removed,
                        run.took_ms(),
                        run.stopped_early
                    ])
                })
                .map_err(backend)?;
            Ok(())
        })
        .await
    }

    /// `AdminStorage::last_purge`: a read on a pooled connection.
    pub(crate) async fn last_purge_run(&self) -> Result<Option<PurgeRun>> {
        self.run(false, |conn, inner| {
            conn.prepare_cached(&runs_sql(LAST_RUN))
                .and_then(|mut stmt| {
                    stmt.query_row([&inner.table], |r| {
                        Ok(PurgeRun::from_stored(
                            r.get(0)?,
                            r.get(1)?,
                            r.get(2)?,
                            r.get(3)?,
                        ))
                    })
                    .optional()
                })
                .map_err(backend)
        })
        .await
    }
}
