//! Purge batches: bounded keyset walks of the `claimed_at` index.

use std::time::Instant;

use async_trait::async_trait;
use dedup_core::Result;
use dedup_core::backend::{PurgeBatch, PurgeBatches, PurgeStep};
use sqlx::{AssertSqlSafe, Row};

use crate::MySqlStore;
use crate::error::backend;
use crate::statements::{BEGIN, retention_param};

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
impl PurgeBatches for MySqlStore {
    type PurgeCursor = Cursor;

    /// One transaction: the batch's victims read and locked (`FOR UPDATE SKIP LOCKED`,
    /// at most `step.limit`), deleted by primary key, committed. Its work time is the
    /// transaction's, without the wait for a pooled connection.
    async fn purge_batch(&self, step: &PurgeStep, cursor: &mut Cursor) -> Result<PurgeBatch> {
        let limit = i64::try_from(step.limit).unwrap_or(i64::MAX);
        let mut conn = self.pool().acquire().await.map_err(backend)?;
        let started = Instant::now();
        let mut tx = sqlx::Connection::begin_with(&mut *conn, BEGIN)
            .await
            .map_err(backend)?;
        let rows = sqlx::query(AssertSqlSafe(self.statements().purge_select.clone()))
            .bind(self.now_param())
            .bind(retention_param(step.retention))
            .bind(cursor.claimed_from)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .map_err(backend)?;
        let mut batch = PurgeBatch {
            exhausted: rows.len() < step.limit,
            ..PurgeBatch::default()
        };
        let mut keys = Vec::with_capacity(rows.len());
        let mut claimed_from = cursor.claimed_from;
        for row in &rows {
            let consumer: Vec<u8> = row.try_get("consumer").map_err(backend)?;
            let message_id: Vec<u8> = row.try_get("message_id").map_err(backend)?;
            let processed_at: Option<i64> = row.try_get("processed_at").map_err(backend)?;
            let claimed_at: i64 = row.try_get("claimed_at").map_err(backend)?;
            claimed_from = claimed_from.max(claimed_at);
            match processed_at {
                Some(_) => batch.completed += 1,
                None => batch.expired += 1,
            }
            keys.push((consumer, message_id));
        }
        for chunk in keys.chunks(1000) {
            let mut query = sqlx::query(AssertSqlSafe(self.statements().delete(chunk.len())));
            for (consumer, message_id) in chunk {
                query = query.bind(consumer).bind(message_id);
            }
            query.execute(&mut *tx).await.map_err(backend)?;
        }
        tx.commit().await.map_err(backend)?;
        cursor.claimed_from = claimed_from;
        batch.work = Some(started.elapsed());
        Ok(batch)
    }
}
