//! [`AdminStorage`] (the operator's reads) for [`MySqlStore`]: listing and counting with
//! plain queries on the table; forget and revoke as the store's own locked transactions.
//!
//! "Now" is the statements' own ([`crate::statements::NOW_MS`]). Listing walks the primary
//! key from the `after` id in byte order (the key columns are `VARBINARY`, so paging agrees
//! with every other store); the counts and the most retried keys read the whole table,
//! unless the store keeps counts ([`crate::counts`], opt-in): then the counts are the kept
//! ones plus the expired leases, read through the in-flight index, as is the oldest live
//! lease. The size is InnoDB's `data_length + index_length` from `information_schema.tables` (an
//! estimate the server refreshes with its statistics).
//!
//! Forgetting and revoking read the record with a lock and apply
//! `transition::forget` / `transition::revoke` to it, in one transaction.

use async_trait::async_trait;
use std::time::Duration;

use dedup_core::admin::{
    ConsumerCounts, CountSource, Forgot, ListFilter, MAX_CONSUMERS, PurgeCount, Stats, Status,
};
use dedup_core::backend::AdminStorage;
use dedup_core::backend::transition::{self, Write};
use dedup_core::{Key, LeaseToken, Record, Result, Timestamp};
use dedup_sql::query::key_as_bytes;
use sqlx::{AssertSqlSafe, MySql, SqlSafeStr};

use crate::MySqlStore;
use crate::counts;
use crate::decode::decode_keyed_record;
use crate::error::{Backend, backend};
use crate::statements::{NOW_MS, row_cols};
use dedup_sql::admin::{self, AdminDialect};

/// MySQL's SQL for the shared admin conditions (and kept counts' reads, [`crate::counts`]).
pub(crate) struct Dialect;

impl AdminDialect for Dialect {
    fn outcome_starts_with(hex: &str) -> String {
        format!("LEFT(outcome, {}) = X'{hex}'", hex.len() / 2)
    }

    fn count_where(condition: &str) -> String {
        format!("CAST(COALESCE(SUM({condition}), 0) AS SIGNED)")
    }
}

#[async_trait]
impl AdminStorage for MySqlStore {
    async fn now(&self) -> Result<Timestamp> {
        admin::now::<Backend>(self.pool(), NOW_MS, self.now_param()).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        let sql = format!(
            "SELECT {columns} FROM (SELECT {NOW_MS} AS ms) n STRAIGHT_JOIN {table} \
             WHERE consumer = ? AND message_id > ? AND {status} \
             ORDER BY message_id LIMIT ?",
            columns = row_cols(""),
            table = self.table(),
            status = admin::status_condition::<Dialect>(filter.status, "n.ms"),
        );
        // The key columns are VARBINARY: the id to start after is bound as bytes.
        admin::list(self, sql, filter, key_as_bytes, decode_keyed_record).await
    }

    async fn stats(&self, top: usize) -> Result<Stats> {
        let table = self.table();
        // Every part uses the "now" just read, so they agree with the counts.
        let now = AdminStorage::now(self).await?;
        let mut stats = Stats::at(now);
        if counts::kept(self).await? {
            for consumer in counts::read(self, now, None).await? {
                for status in Status::ALL {
                    *stats.count_mut(status) += consumer.counts.count(status);
                }
            }
        } else {
            let counts = sqlx::query(AssertSqlSafe(format!(
                "SELECT {} FROM (SELECT CAST(? AS SIGNED) AS ms) n STRAIGHT_JOIN {table}",
                admin::status_counts::<Dialect>("n.ms"),
            )))
            .bind(now.as_millis())
            .fetch_one(self.pool())
            .await
            .map_err(backend)?;
            admin::read_counts::<MySql>(&counts, &mut stats, backend)?;
        }
        let size: Option<i64> = sqlx::query_scalar(
            "SELECT CAST(data_length + index_length AS SIGNED) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = ?",
        )
        .bind(&self.config().table)
        .fetch_optional(self.pool())
        .await
        .map_err(backend)?;
        stats.size_bytes = size.and_then(|s| u64::try_from(s).ok());
        let columns = row_cols("");
        let oldest = format!(
            "SELECT {columns} FROM {table} WHERE {} \
             ORDER BY expires_at, consumer, message_id LIMIT 1",
            admin::status_condition::<Dialect>(Some(Status::InFlight), "?")
        );
        let retried = format!(
            "SELECT {columns} FROM {table} WHERE attempt >= 2 \
             ORDER BY attempt DESC, consumer, message_id LIMIT ?"
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
            "SELECT consumer, {} FROM (SELECT CAST(? AS SIGNED) AS ms) n \
             STRAIGHT_JOIN {table} GROUP BY consumer ORDER BY consumer LIMIT {MAX_CONSUMERS}",
            admin::status_counts::<Dialect>("n.ms"),
            table = self.table(),
        );
        admin::consumers::<Backend>(self.pool(), sql, now, |row| {
            Ok(crate::decode::text(row, "consumer")?.unwrap_or_default())
        })
        .await
    }

    async fn count_purgeable(&self, retention: Duration) -> Result<PurgeCount> {
        let sql = AssertSqlSafe(self.statements().count_purgeable.clone()).into_sql_str();
        admin::purgeable::<Backend>(self.pool(), sql, self.now_param(), retention).await
    }

    async fn last_purge(&self) -> Result<Option<dedup_core::PurgeRun>> {
        self.last_purge_run().await
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

    async fn forget(&self, key: &Key, force: bool) -> Result<Forgot> {
        self.locked("forget", &[key], |w| {
            let forgot = transition::forget(w.record(key), force, w.now);
            if matches!(forgot, Forgot::Forgot { .. }) {
                w.remove(key);
            }
            forgot
        })
        .await
    }

    async fn revoke(
        &self,
        key: &Key,
        token: LeaseToken,
        force: bool,
        new_token: LeaseToken,
    ) -> Result<bool> {
        self.locked("revoke", &[key], |w| {
            match transition::revoke(w.record(key), token, force, new_token, w.now) {
                Some(record) => {
                    w.apply(key, Write::Put(record), false);
                    true
                }
                None => false,
            }
        })
        .await
    }
}
