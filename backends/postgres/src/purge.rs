//! Purge in bounded keyset batches.

use dedup_core::{PurgeOptions, PurgeReport, Result, duration_millis};
use sqlx::Row;

use crate::PostgresStore;
use crate::error::backend;

/// Run batches until one removes fewer than `batch_size` records or `max_batches` ran.
pub(crate) async fn purge(store: &PostgresStore, options: &PurgeOptions) -> Result<PurgeReport> {
    // Clamped so "now - retention" cannot overflow in SQL; no real retention is near.
    let retention_ms = duration_millis(options.retention).min(i64::MAX / 4);
    let batch_size = i64::try_from(options.batch_size).unwrap_or(i64::MAX);
    // Where the next batch starts in the claimed_at index: at the largest claimed_at the
    // previous batches removed. Rows a batch skipped because someone else held them, with
    // earlier claims, are left to that holder (another purger deletes them) or to the next
    // purge.
    let mut claimed_from = i64::MIN;
    let mut report = PurgeReport::default();
    while options.max_batches.is_none_or(|max| report.batches < max) {
        let rows = sqlx::query(store.statements().purge_batch.clone())
            .bind(store.now_param())
            .bind(retention_ms)
            .bind(batch_size)
            .bind(claimed_from)
            .fetch_all(store.pool())
            .await
            .map_err(backend)?;
        report.batches += 1;
        for row in &rows {
            let processed_at: Option<i64> = row.try_get("processed_at").map_err(backend)?;
            let claimed_at: i64 = row.try_get("claimed_at").map_err(backend)?;
            claimed_from = claimed_from.max(claimed_at);
            match processed_at {
                Some(_) => report.completed += 1,
                None => report.expired += 1,
            }
        }
        if rows.len() < options.batch_size {
            break;
        }
    }
    Ok(report)
}
