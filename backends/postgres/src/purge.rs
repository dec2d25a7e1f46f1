//! Purge in bounded keyset batches.

use dedup_core::{PurgeOptions, PurgeReport, Result, duration_millis};
use sqlx::Row;

use crate::PostgresStore;
use crate::error::backend;

/// Where the next batch starts in each purge index: at or after the largest timestamp the
/// previous batches removed. Rows a batch skipped because someone else held them, with
/// earlier timestamps, are left to that holder (another purger deletes them) or to the next
/// purge.
struct Keyset {
    completed_from: i64,
    expired_from: i64,
}

/// Run batches until one removes fewer than `batch_size` records or `max_batches` ran.
pub(crate) async fn purge(store: &PostgresStore, options: &PurgeOptions) -> Result<PurgeReport> {
    // Clamped so "now - retention" cannot overflow in SQL; no real retention is near.
    let retention_ms = duration_millis(options.retention).min(i64::MAX / 4);
    let batch_size = i64::try_from(options.batch_size).unwrap_or(i64::MAX);
    let mut keyset = Keyset {
        completed_from: i64::MIN,
        expired_from: i64::MIN,
    };
    let mut report = PurgeReport::default();
    while options.max_batches.is_none_or(|max| report.batches < max) {
        let rows = sqlx::query(store.statements().purge_batch.clone())
            .bind(store.now_param())
            .bind(retention_ms)
            .bind(batch_size)
            .bind(keyset.completed_from)
            .bind(keyset.expired_from)
            .fetch_all(store.pool())
            .await
            .map_err(backend)?;
        report.batches += 1;
        for row in &rows {
            let processed_at: Option<i64> = row.try_get("processed_at").map_err(backend)?;
            match processed_at {
                Some(at) => {
                    report.completed += 1;
                    keyset.completed_from = keyset.completed_from.max(at);
                }
                None => {
                    report.expired += 1;
                    let at: Option<i64> = row.try_get("expires_at").map_err(backend)?;
                    keyset.expired_from = keyset.expired_from.max(at.unwrap_or(i64::MIN));
                }
            }
        }
        if rows.len() < options.batch_size {
            break;
        }
    }
    Ok(report)
}
