//! [`AdminStorage`] (and so [`Admin`](dedup_core::Admin)) for [`SqliteStore`]: listing
//! and counting with plain queries on the records table, on a pooled connection (reads
//! only; they never wait for the write gate). Forgetting and revoking a lease are writes:
//! each is one write of the store's queue, which reads the record and applies
//! [`transition::forget`] / [`transition::revoke`] under the write lock.
//!
//! Listing walks the primary key `(consumer, message_id)` from the `after` id, so a page
//! costs what it returns (plus the rows its status filter skips). The counts read the whole
//! table once, unless the store keeps counts ([`crate::counts`], opt-in): then they are the
//! kept ones plus the expired leases, read through the in-flight records' partial index,
//! which also serves the oldest live lease (without it, that reads the table). The most
//! retried keys read the whole table. The size is the database file's (every table in it).

use async_trait::async_trait;
use dedup_core::admin::{
    ConsumerCounts, CountSource, Forgot, KeySummary, ListFilter, MAX_CONSUMERS, PurgeCount, Stats,
    Status,
};
use dedup_core::backend::AdminStorage;
use dedup_core::backend::transition::{self, Write};
use dedup_core::backend::{DEAD_LETTER_PREFIX_HEX, FAILED_PREFIX_HEX};
use dedup_core::{Key, LeaseToken, Record, Result, Timestamp};
use rusqlite::{Connection, Row, params};
use std::time::Duration;

use crate::SqliteStore;
use crate::counts;
use crate::decode::{self, RawRow};
use crate::error::backend;
use crate::statements::{COLUMN_COUNT, COLUMNS, PURGEABLE};

/// The condition selecting completed records whose outcome starts with the verdict prefix
/// `hex` (see [`Status`]: failed and dead-lettered records are told apart by it).
fn verdict(hex: &str) -> String {
    format!(
        "(state = 'completed' AND substr(outcome, 1, {}) = X'{hex}')",
        hex.len() / 2
    )
}

/// The condition selecting records in `status` at now `now` (a parameter name or value).
fn status_condition(status: Option<Status>, now: &str) -> String {
    let (failed, dead) = (verdict(FAILED_PREFIX_HEX), verdict(DEAD_LETTER_PREFIX_HEX));
    match status {
        None => "1".into(),
        Some(Status::InFlight) => format!("(state = 'in_flight' AND expires_at > {now})"),
        Some(Status::Expired) => format!("(state = 'in_flight' AND expires_at <= {now})"),
        Some(Status::Completed) => {
            format!("(state = 'completed' AND NOT coalesce({failed} OR {dead}, 0))")
        }
        Some(Status::Failed) => failed,
        Some(Status::DeadLettered) => dead,
    }
}

/// `SELECT` expressions counting records by status at now `?1`, in [`Status::ALL`] order.
fn status_counts() -> String {
    Status::ALL
        .iter()
        .map(|s| format!("coalesce(sum({}), 0)", status_condition(Some(*s), "?1")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The counts of a row of [`status_counts`] starting at column `first`, into `stats`.
fn read_counts(row: &Row<'_>, first: usize, stats: &mut Stats) -> rusqlite::Result<()> {
    for (i, status) in Status::ALL.iter().enumerate() {
        let n: i64 = row.get(first + i)?;
        *stats.count_mut(*status) = n as u64;
    }
    Ok(())
}

/// A row of `SELECT {COLUMNS}, consumer, message_id` as a record.
fn record_of(row: &Row<'_>) -> rusqlite::Result<(Key, RawRow)> {
    let consumer: String = row.get(COLUMN_COUNT)?;
    let message_id: String = row.get(COLUMN_COUNT + 1)?;
    let key = Key::new(consumer, message_id).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(8, rusqlite::types::Type::Text, e.into())
    })?;
    Ok((key, RawRow::read(row)?))
}

/// Run `sql` with named parameters and decode every row.
fn records(
    conn: &Connection,
    sql: &str,
    params: &[(&str, &dyn rusqlite::ToSql)],
) -> Result<Vec<Record>> {
    let mut stmt = conn.prepare_cached(sql).map_err(backend)?;
    let rows = stmt
        .query_map(params, record_of)
        .map_err(backend)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(backend)?;
    rows.into_iter()
        .map(|(key, raw)| raw.into_record(&key))
        .collect()
}

#[async_trait]
impl AdminStorage for SqliteStore {
    async fn now(&self) -> Result<Timestamp> {
        Ok(self.inner.clock.now())
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        let filter = filter.clone();
        self.run(false, move |conn, inner| {
            let sql = format!(
                "SELECT {COLUMNS}, consumer, message_id FROM \"{table}\" \
                 WHERE consumer = :consumer AND message_id > :after AND {status} \
                 ORDER BY message_id LIMIT :limit",
                table = inner.table,
                status = status_condition(filter.status, ":now"),
            );
            let now = inner.clock.now().as_millis();
            let after = filter.after.clone().unwrap_or_default();
            let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
            let mut params: Vec<(&str, &dyn rusqlite::ToSql)> = vec![
                (":consumer", &filter.consumer),
                (":after", &after),
                (":limit", &limit),
            ];
            if matches!(filter.status, Some(Status::InFlight | Status::Expired)) {
                params.push((":now", &now));
            }
            records(conn, &sql, &params)
        })
        .await
    }

    async fn stats(&self, top: usize) -> Result<Stats> {
        self.run(false, move |conn, inner| {
            let table = &inner.table;
            let now = inner.clock.now();
            let tx = conn.transaction().map_err(backend)?;
            let mut stats = Stats::at(now);
            if counts::kept(&tx, table)? {
                for consumer in counts::read(&tx, table, now, None)? {
                    for status in Status::ALL {
                        *stats.count_mut(status) += consumer.counts.count(status);
                    }
                }
            } else {
                tx.query_row(
                    &format!("SELECT {} FROM \"{table}\"", status_counts()),
                    params![now.as_millis()],
                    |r| read_counts(r, 0, &mut stats),
                )
                .map_err(backend)?;
            }
            let oldest = records(
                &tx,
                &format!(
                    "SELECT {COLUMNS}, consumer, message_id FROM \"{table}\" \
                     WHERE state = 'in_flight' AND expires_at > :now \
                     ORDER BY expires_at, consumer, message_id LIMIT 1"
                ),
                &[(":now", &now.as_millis())],
            )?;
            let retried = records(
                &tx,
                &format!(
                    "SELECT {COLUMNS}, consumer, message_id FROM \"{table}\" \
                     WHERE attempt >= 2 ORDER BY attempt DESC, consumer, message_id \
                     LIMIT :top"
                ),
                &[(":top", &i64::try_from(top).unwrap_or(i64::MAX))],
            )?;
            let size: i64 = tx
                .query_row(
                    "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
                    [],
                    |r| r.get(0),
                )
                .map_err(backend)?;
            stats.oldest_live = oldest.first().map(|r| KeySummary::of(r, now));
            stats.most_retried = retried.iter().map(|r| KeySummary::of(r, now)).collect();
            stats.size_bytes = u64::try_from(size).ok();
            Ok(stats)
        })
        .await
    }

    async fn consumers(&self) -> Result<Vec<ConsumerCounts>> {
        self.run(false, move |conn, inner| {
            let now = inner.clock.now();
            let tx = conn.transaction().map_err(backend)?;
            if counts::kept(&tx, &inner.table)? {
                return counts::read(&tx, &inner.table, now, Some(MAX_CONSUMERS));
            }
            let sql = format!(
                "SELECT consumer, {} FROM \"{table}\" GROUP BY consumer ORDER BY consumer \
                 LIMIT {MAX_CONSUMERS}",
                status_counts(),
                table = inner.table,
            );
            let mut stmt = tx.prepare_cached(&sql).map_err(backend)?;
            let rows = stmt
                .query_map(params![now.as_millis()], |r| {
                    let mut counts = ConsumerCounts::new(r.get::<_, String>(0)?, now);
                    read_counts(r, 1, &mut counts.counts)?;
                    Ok(counts)
                })
                .map_err(backend)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(backend)?;
            Ok(rows)
        })
        .await
    }

    async fn count_purgeable(&self, retention: Duration) -> Result<PurgeCount> {
        self.run(false, move |conn, inner| {
            let now = inner.clock.now();
            let cutoff = now.saturating_sub(retention).as_millis();
            let (completed, expired): (i64, i64) = conn
                .query_row(
                    &format!(
                        "SELECT coalesce(sum(state = 'completed'), 0), \
                                coalesce(sum(state = 'in_flight'), 0) \
                         FROM \"{table}\" WHERE {PURGEABLE}",
                        table = inner.table
                    ),
                    params![cutoff, now.as_millis()],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .map_err(backend)?;
            Ok(PurgeCount {
                completed: completed as u64,
                expired: expired as u64,
            })
        })
        .await
    }

    async fn last_purge(&self) -> Result<Option<dedup_core::PurgeRun>> {
        self.last_purge_run().await
    }

    async fn forget(&self, key: &Key, force: bool) -> Result<Forgot> {
        let key = key.clone();
        self.write(move |conn, inner, now| {
            let record = decode::select(conn, &inner.statements, &key)?;
            let forgot = transition::forget(record.as_ref(), force, now);
            if matches!(forgot, Forgot::Forgot { .. }) {
                conn.prepare_cached(&inner.statements.delete)
                    .and_then(|mut stmt| stmt.execute(params![key.consumer(), key.message_id()]))
                    .map_err(backend)?;
            }
            Ok(forgot)
        })
        .await
    }

    async fn count_source(&self) -> Result<CountSource> {
        self.run(false, |conn, inner| {
            Ok(match counts::kept(conn, &inner.table)? {
                true => CountSource::Kept,
                false => CountSource::Scan { keepable: true },
            })
        })
        .await
    }

    async fn enable_counts(&self) -> Result<bool> {
        self.run(true, |conn, inner| counts::enable(conn, &inner.table))
            .await
    }

    async fn disable_counts(&self) -> Result<bool> {
        self.run(true, |conn, inner| counts::disable(conn, &inner.table))
            .await
    }

    async fn revoke(
        &self,
        key: &Key,
        token: LeaseToken,
        force: bool,
        new_token: LeaseToken,
    ) -> Result<bool> {
        let key = key.clone();
        self.write(move |conn, inner, now| {
            let record = decode::select(conn, &inner.statements, &key)?;
            match transition::revoke(record.as_ref(), token, force, new_token, now) {
                Some(record) => inner.apply(conn, Write::Put(record)).map(|()| true),
                None => Ok(false),
            }
        })
        .await
    }
}
