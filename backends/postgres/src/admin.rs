//! [`Admin`] for [`PostgresStore`]: listing and counting with plain queries on the table.
//!
//! "Now" is the same as for leases: the injected clock, else the server's
//! `clock_timestamp()`. Listing walks the primary key from the `after` id in byte order
//! (`COLLATE "C"`, so paging agrees with every other store whatever the database's
//! collation); the counts and the most retried keys read the whole table (one aggregate
//! query, one sort); the oldest live lease reads every in-flight row. The size is
//! `pg_total_relation_size` (table, indexes and TOAST).

use async_trait::async_trait;
use std::time::Duration;

use dedup_core::admin::{KeySummary, ListFilter, PurgeCount, Stats, Status};
use dedup_core::backend::AdminStorage;
use dedup_core::{Key, Record, Result, Timestamp, duration_millis};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Row};

use crate::PostgresStore;
use crate::error::backend;
use crate::decode::decode_record;

/// "Now" in milliseconds from `$1` (the injected clock) or the server's clock.
const NOW_MS: &str =
    "coalesce($1::bigint, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)";

/// The key and record columns, as [`decode_record`] reads them.
const COLUMNS: &str = "consumer, message_id, token::text AS token, fence, attempt, expires_at, \
     processed_at, outcome, fingerprint";

/// The condition selecting rows in `status` at now `now.ms`.
fn status_condition(status: Option<Status>) -> &'static str {
    match status {
        None => "true",
        Some(Status::InFlight) => "processed_at IS NULL AND expires_at > now.ms",
        Some(Status::Expired) => "processed_at IS NULL AND expires_at <= now.ms",
        Some(Status::Completed) => "processed_at IS NOT NULL",
    }
}

/// The count in column `name` of `row`.
fn count_of(row: &PgRow, name: &str) -> Result<u64> {
    let n: i64 = row.try_get(name).map_err(backend)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The record of a row holding [`COLUMNS`].
fn record_of(row: &PgRow) -> Result<Record> {
    let consumer: String = row.try_get("consumer").map_err(backend)?;
    let message_id: String = row.try_get("message_id").map_err(backend)?;
    let key = Key::new(consumer, message_id)?;
    decode_record(row, &key)
}

#[async_trait]
impl AdminStorage for PostgresStore {
    async fn now(&self) -> Result<Timestamp> {
        let ms: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT {NOW_MS}")))
            .bind(self.now_param())
            .fetch_one(self.pool())
            .await
            .map_err(backend)?;
        Ok(Timestamp::from_millis(ms))
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM {table}, (SELECT {NOW_MS} AS ms) now \
             WHERE consumer = $2 AND message_id COLLATE \"C\" > $3 AND {status} \
             ORDER BY message_id COLLATE \"C\" LIMIT $4",
            table = self.table(),
            status = status_condition(filter.status),
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(self.now_param())
            .bind(&filter.consumer)
            .bind(filter.after.as_deref().unwrap_or(""))
            .bind(i64::try_from(filter.limit).unwrap_or(i64::MAX))
            .fetch_all(self.pool())
            .await
            .map_err(backend)?
            .iter()
            .map(record_of)
            .collect()
    }

    async fn stats(&self, top: usize) -> Result<Stats> {
        let table = self.table();
        let now = AdminStorage::now(self).await?;
        let counts = sqlx::query(AssertSqlSafe(format!(
            "SELECT \
               count(*) FILTER (WHERE processed_at IS NULL AND expires_at > $1) AS in_flight, \
               count(*) FILTER (WHERE processed_at IS NULL AND expires_at <= $1) AS expired, \
               count(*) FILTER (WHERE processed_at IS NOT NULL) AS completed, \
               pg_total_relation_size($2::regclass) AS size \
             FROM {table}"
        )))
        .bind(now.as_millis())
        .bind(table)
        .fetch_one(self.pool())
        .await
        .map_err(backend)?;
        let count = |name: &str| count_of(&counts, name);
        let mut stats = Stats::at(now);
        stats.in_flight = count("in_flight")?;
        stats.expired = count("expired")?;
        stats.completed = count("completed")?;
        stats.size_bytes = Some(count("size")?);
        // `$1` is the "now" just read, so every part agrees with the counts.
        let oldest = sqlx::query(AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM {table} WHERE processed_at IS NULL AND expires_at > $1 \
             ORDER BY expires_at, consumer COLLATE \"C\", message_id COLLATE \"C\" LIMIT 1"
        )))
        .bind(now.as_millis())
        .fetch_optional(self.pool())
        .await
        .map_err(backend)?;
        stats.oldest_live = oldest
            .as_ref()
            .map(record_of)
            .transpose()?
            .map(|r| KeySummary::of(&r, now));
        let retried = sqlx::query(AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM {table} WHERE attempt >= 2 \
             ORDER BY attempt DESC, consumer COLLATE \"C\", message_id COLLATE \"C\" LIMIT $1"
        )))
        .bind(i64::try_from(top).unwrap_or(i64::MAX))
        .fetch_all(self.pool())
        .await
        .map_err(backend)?
        .iter()
        .map(record_of)
        .collect::<Result<Vec<_>>>();
        stats.most_retried = retried?.iter().map(|r| KeySummary::of(r, now)).collect();
        Ok(stats)
    }

    async fn count_purgeable(&self, retention: Duration) -> Result<PurgeCount> {
        // The purge statement's condition (`claimed_at` first, for its index), counted.
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT count(*) FILTER (WHERE processed_at < cutoff.ms) AS completed, \
                    count(*) FILTER (WHERE processed_at IS NULL AND expires_at < cutoff.ms) \
                      AS expired \
             FROM {table}, (SELECT {NOW_MS} - $2::bigint AS ms) cutoff \
             WHERE claimed_at < cutoff.ms",
            table = self.table()
        )))
        .bind(self.now_param())
        .bind(duration_millis(retention))
        .fetch_one(self.pool())
        .await
        .map_err(backend)?;
        let count = |name: &str| count_of(&row, name);
        Ok(PurgeCount {
            completed: count("completed")?,
            expired: count("expired")?,
        })
    }
}
