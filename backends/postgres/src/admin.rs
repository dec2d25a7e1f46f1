//! [`AdminStorage`] (the operator's reads) for [`PostgresStore`]: listing and counting
//! with plain queries on the table.
//!
//! "Now", the record columns and the purgeable condition are the statements' own
//! ([`crate::statements`]): the injected clock, else the server's `clock_timestamp()`, and
//! [`count_purgeable`](AdminStorage::count_purgeable) runs the purge batch's condition. Listing walks the primary key from the `after` id in byte order
//! (`COLLATE "C"`, so paging agrees with every other store whatever the database's
//! collation); the counts and the most retried keys read the whole table (one aggregate
//! query, one sort); the oldest live lease reads every in-flight row. A store that keeps
//! counts ([`crate::counts`], opt-in) reads them instead of the table, plus its expired
//! leases, and the oldest live lease, through the in-flight rows' partial index. The size
//! is `pg_total_relation_size` (table, indexes and TOAST).
//!
//! Forgetting a record is one `DELETE` whose condition is `transition::forget`'s (no live
//! lease at the statement's "now", or forced); revoking a lease is one `UPDATE` of the
//! token read (see [`crate::statements`]).

use async_trait::async_trait;
use std::time::Duration;

use dedup_core::admin::{
    ConsumerCounts, CountSource, Forgot, ListFilter, MAX_CONSUMERS, PurgeCount, Stats, Status,
};
use dedup_core::backend::{AdminStorage, Storage, attempt_from, fence_from};
use dedup_core::{Error, Key, LeaseToken, Record, RecordState, Result, Timestamp};
use dedup_sql::query::key_as_text;
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Postgres, Row};

use crate::PostgresStore;
use crate::counts;
use crate::decode::decode_keyed_record;
use crate::error::{Backend, again_if_moved, backend};
use crate::statements::{AdminSql as Dialect, NOW_MS, row_cols};
use dedup_sql::admin;

#[async_trait]
impl AdminStorage for PostgresStore {
    async fn now(&self) -> Result<Timestamp> {
        admin::now::<Backend>(self.pool(), NOW_MS, self.now_param()).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        let sql = format!(
            "SELECT {columns} FROM {table}, (SELECT {NOW_MS} AS ms) now \
             WHERE consumer = $2 AND message_id COLLATE \"C\" > $3 AND {status} \
             ORDER BY message_id COLLATE \"C\" LIMIT $4",
            columns = row_cols(""),
            table = self.table(),
            status = admin::status_condition::<Dialect>(filter.status, "now.ms"),
        );
        admin::list(self, sql, filter, key_as_text, decode_keyed_record).await
    }

    async fn stats(&self, top: usize) -> Result<Stats> {
        let table = self.table();
        // `$1` is the "now" just read, so every part agrees with the counts.
        let now = AdminStorage::now(self).await?;
        let mut stats = Stats::at(now);
        if counts::kept(self).await? {
            for consumer in counts::read(self, now, None).await? {
                for status in Status::ALL {
                    *stats.count_mut(status) += consumer.counts.count(status);
                }
            }
            let size: i64 = sqlx::query_scalar("SELECT pg_total_relation_size($1::regclass)")
                .bind(table)
                .fetch_one(self.pool())
                .await
                .map_err(backend)?;
            stats.size_bytes = u64::try_from(size).ok();
        } else {
            let counts = sqlx::query(AssertSqlSafe(format!(
                "SELECT {counts}, pg_total_relation_size($2::regclass) AS size FROM {table}",
                counts = admin::status_counts::<Dialect>("$1"),
            )))
            .bind(now.as_millis())
            .bind(table)
            .fetch_one(self.pool())
            .await
            .map_err(backend)?;
            admin::read_counts::<Postgres>(&counts, &mut stats, backend)?;
            stats.size_bytes = Some(admin::count_of::<Postgres>(&counts, "size", backend)?);
        }
        let columns = row_cols("");
        let in_flight = admin::status_condition::<Dialect>(Some(Status::InFlight), "$1");
        let oldest = format!(
            "SELECT {columns} FROM {table} WHERE {in_flight} \
             ORDER BY expires_at, consumer COLLATE \"C\", message_id COLLATE \"C\" LIMIT 1"
        );
        let retried = format!(
            "SELECT {columns} FROM {table} WHERE attempt >= 2 \
             ORDER BY attempt DESC, consumer COLLATE \"C\", message_id COLLATE \"C\" LIMIT $1"
        );
        admin::keys_to_watch(self, oldest, retried, top, decode_keyed_record, &mut stats).await?;
        Ok(stats)
    }

    async fn consumers(&self) -> Result<Vec<ConsumerCounts>> {
        let now = AdminStorage::now(self).await?;
        if counts::kept(self).await? {
            return counts::read(self, now, Some(MAX_CONSUMERS)).await;
        }
        let sql = format!(
            "SELECT consumer, {counts} FROM {table} \
             GROUP BY consumer ORDER BY consumer COLLATE \"C\" LIMIT {MAX_CONSUMERS}",
            counts = admin::status_counts::<Dialect>("$1"),
            table = self.table(),
        );
        admin::consumers::<Backend>(self.pool(), sql, now, |row| {
            row.try_get("consumer").map_err(backend)
        })
        .await
    }

    async fn count_purgeable(&self, retention: Duration) -> Result<PurgeCount> {
        if let Some(partitions) = &self.config().partitions {
            partitions.check_retention(self.table(), retention)?;
        }
        let sql = self.statements().count_purgeable.clone();
        admin::purgeable::<Backend>(self.pool(), sql, self.now_param(), retention).await
    }

    async fn last_purge(&self) -> Result<Option<dedup_core::PurgeRun>> {
        self.last_purge_run().await
    }

    async fn forget(&self, key: &Key, force: bool) -> Result<Forgot> {
        // A delete that removes nothing finds the record absent or held by a live lease;
        // the read after it tells which. Should the read find a record the delete would
        // have removed (its lease expired or was released in between), delete again.
        for _ in 0..FORGET_TRIES {
            let deleted = again_if_moved(|| {
                sqlx::query(self.statements().forget.clone())
                    .bind(self.now_param())
                    .bind(key.consumer())
                    .bind(key.message_id())
                    .bind(force)
                    .fetch_optional(self.pool())
            })
            .await
            .map_err(backend)?;
            if let Some(row) = deleted {
                return forgot_of(key, &row);
            }
            let now = AdminStorage::now(self).await?;
            match Storage::get(self, key).await? {
                None => return Ok(Forgot::NotFound),
                Some(Record {
                    state: RecordState::InFlight { expires_at, .. },
                    attempt,
                    ..
                }) if now < expires_at => {
                    return Ok(Forgot::LiveLease {
                        expires_at,
                        attempt,
                    });
                }
                Some(_) => continue,
            }
        }
        Err(Error::lease_lost(key))
    }

    async fn count_source(&self) -> Result<CountSource> {
        Ok(match counts::kept(self).await? {
            true => CountSource::Kept,
            false => CountSource::Scan { keepable: true },
        })
    }

    async fn enable_counts(&self) -> Result<bool> {
        counts::enable(self).await
    }

    async fn disable_counts(&self) -> Result<bool> {
        counts::disable(self).await
    }

    async fn revoke(
        &self,
        key: &Key,
        token: LeaseToken,
        force: bool,
        new_token: LeaseToken,
    ) -> Result<bool> {
        let revoked = again_if_moved(|| {
            sqlx::query(self.statements().revoke.clone())
                .bind(self.now_param())
                .bind(key.consumer())
                .bind(key.message_id())
                .bind(token.to_string())
                .bind(new_token.to_string())
                .bind(force)
                .fetch_optional(self.pool())
        })
        .await
        .map_err(backend)?;
        Ok(revoked.is_some())
    }
}

/// How many times [`AdminStorage::forget`] deletes again when the record changed between
/// its delete and its read.
const FORGET_TRIES: usize = 3;

/// The row the forget statement deleted, as its answer.
fn forgot_of(key: &Key, row: &PgRow) -> Result<Forgot> {
    let get = |name: &str| -> Result<Option<i64>> { row.try_get(name).map_err(backend) };
    let now = get("now_ms")?.unwrap_or_default();
    let outcome: Option<Vec<u8>> = row.try_get("outcome").map_err(backend)?;
    let status = match (get("processed_at")?, get("expires_at")?) {
        (Some(_), _) => Status::of_outcome(outcome.as_deref()),
        (None, Some(expires_at)) if now < expires_at => Status::InFlight,
        (None, Some(_)) => Status::Expired,
        (None, None) => {
            return Err(Error::corrupt(
                key,
                "in-flight record without an expiry".to_owned(),
            ));
        }
    };
    Ok(Forgot::Forgot {
        status,
        fence: fence_from(key, get("fence")?.unwrap_or_default())?,
        attempt: attempt_from(key, get("attempt")?.unwrap_or_default())?,
    })
}
