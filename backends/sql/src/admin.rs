//! The operator's reads ([`AdminStorage`](dedup_core::backend::AdminStorage)) both sqlx
//! backends share: the conditions selecting records by [`Status`], the counts per status in
//! one aggregate row, reading those counts back, and running a backend's read statements
//! (the records a listing selects, the keys to watch, the counts per consumer, the
//! purgeable counts). A backend supplies how its SQL tests an outcome's prefix and counts
//! rows ([`AdminDialect`]), its statements and its record decoding.

use std::time::Duration;

use dedup_core::admin::{ConsumerCounts, KeySummary, ListFilter, PurgeCount, Stats, Status};
use dedup_core::backend::{DEAD_LETTER_PREFIX_HEX, FAILED_PREFIX_HEX};
use dedup_core::{Error, Record, Result, Timestamp};
use sqlx::{AssertSqlSafe, Pool, SqlStr};

pub use crate::error::RowOf;
use crate::error::SqlBackend;
use crate::purge::retention_ms;
use crate::query::{Param, SqlDb};
use crate::store::SqlStore;

/// How a backend decodes a record (with its key) from a row of its record columns.
pub type DecodeRecord<B> = fn(&RowOf<B>) -> Result<Record>;

/// What differs in one backend's SQL for the admin reads.
pub trait AdminDialect {
    /// The condition: `outcome` starts with the bytes whose hex is `hex`.
    fn outcome_starts_with(hex: &str) -> String;

    /// An aggregate counting the rows for which `condition` holds, as a 64-bit integer.
    fn count_where(condition: &str) -> String;
}

/// The store's "now" ([`AdminStorage::now`](dedup_core::backend::AdminStorage::now)):
/// `SELECT now_ms` on `pool`, where `now_ms` is the backend's expression of "now" in ms
/// with one parameter, `clock_ms` (the injected clock's reading, or `None`: the server's).
pub async fn now<B: SqlBackend>(
    pool: &Pool<B::Db>,
    now_ms: &str,
    clock_ms: Option<i64>,
) -> Result<Timestamp> {
    let ms = B::Db::select_i64(pool, format!("SELECT {now_ms}"), clock_ms)
        .await
        .map_err(B::error)?;
    Ok(Timestamp::from_millis(ms))
}

/// The condition selecting completed rows whose outcome starts with the verdict prefix
/// `hex` (see [`Status`]: failed and dead-lettered records are told apart by it).
fn verdict<D: AdminDialect>(hex: &str) -> String {
    format!(
        "(processed_at IS NOT NULL AND {})",
        D::outcome_starts_with(hex)
    )
}

/// The condition selecting rows in `status` at the time `now` (an SQL expression, in ms).
pub fn status_condition<D: AdminDialect>(status: Option<Status>, now: &str) -> String {
    let (failed, dead) = (
        verdict::<D>(FAILED_PREFIX_HEX),
        verdict::<D>(DEAD_LETTER_PREFIX_HEX),
    );
    match status {
        None => "TRUE".to_owned(),
        Some(Status::InFlight) => format!("(processed_at IS NULL AND expires_at > {now})"),
        Some(Status::Expired) => format!("(processed_at IS NULL AND expires_at <= {now})"),
        Some(Status::Completed) => {
            format!("(processed_at IS NOT NULL AND NOT COALESCE({failed} OR {dead}, FALSE))")
        }
        Some(Status::Failed) => failed,
        Some(Status::DeadLettered) => dead,
    }
}

/// `SELECT` expressions counting rows by status at `now`, named `n0`.. in [`Status::ALL`]
/// order; [`read_counts`] reads them back.
pub fn status_counts<D: AdminDialect>(now: &str) -> String {
    Status::ALL
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "{} AS n{i}",
                D::count_where(&status_condition::<D>(Some(*s), now))
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The counts of [`status_counts`] in `row`, into `stats`; `error` maps a driver error.
pub fn read_counts<DB: SqlDb>(
    row: &DB::Row,
    stats: &mut Stats,
    error: fn(sqlx::Error) -> Error,
) -> Result<()> {
    for (i, status) in Status::ALL.iter().enumerate() {
        *stats.count_mut(*status) = count_of::<DB>(row, &format!("n{i}"), error)?;
    }
    Ok(())
}

/// The count in column `name` of `row` (a negative one, which no count is, as 0).
pub fn count_of<DB: SqlDb>(
    row: &DB::Row,
    name: &str,
    error: fn(sqlx::Error) -> Error,
) -> Result<u64> {
    let n = DB::get_i64(row, name).map_err(error)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The records `statement` selects with `params`, each decoded by `decode`.
pub async fn records<B: SqlBackend>(
    pool: &Pool<B::Db>,
    statement: String,
    params: &[Param<'_>],
    decode: DecodeRecord<B>,
) -> Result<Vec<Record>> {
    B::Db::fetch_all(pool, AssertSqlSafe(statement), params)
        .await
        .map_err(B::error)?
        .iter()
        .map(decode)
        .collect()
}

/// The records of an operator's listing on `store`: those `statement` selects with its
/// parameters the store's "now", the filter's consumer, the message id to start after
/// (bound by `key`: as text, or as bytes where the backend compares keys byte for byte)
/// and the filter's limit.
pub async fn list<S: SqlStore>(
    store: &S,
    statement: String,
    filter: &ListFilter,
    key: for<'k> fn(&'k str) -> Param<'k>,
    decode: DecodeRecord<S::Backend>,
) -> Result<Vec<Record>> {
    let params = [
        Param::Int(store.store_config().now_param()),
        Param::Text(Some(&filter.consumer)),
        key(filter.after.as_deref().unwrap_or("")),
        Param::Int(Some(i64::try_from(filter.limit).unwrap_or(i64::MAX))),
    ];
    records::<S::Backend>(store.store_pool(), statement, &params, decode).await
}

/// The keys an operator looks at first on `store`, into `stats` at its `now`: the oldest
/// live lease (the first record `oldest` selects, its one parameter "now") and the `top`
/// most retried (the records `retried` selects, its one parameter the limit).
pub async fn keys_to_watch<S: SqlStore>(
    store: &S,
    oldest: String,
    retried: String,
    top: usize,
    decode: DecodeRecord<S::Backend>,
    stats: &mut Stats,
) -> Result<()> {
    let pool = store.store_pool();
    let now = stats.now;
    let at = [Param::Int(Some(now.as_millis()))];
    let oldest = <S::Backend as SqlBackend>::Db::fetch_optional(pool, AssertSqlSafe(oldest), &at)
        .await
        .map_err(<S::Backend as SqlBackend>::error)?;
    stats.oldest_live = oldest
        .as_ref()
        .map(decode)
        .transpose()?
        .map(|r| KeySummary::of(&r, now));
    let limit = [Param::Int(Some(i64::try_from(top).unwrap_or(i64::MAX)))];
    let retried = records::<S::Backend>(pool, retried, &limit, decode).await?;
    stats.most_retried = retried.iter().map(|r| KeySummary::of(r, now)).collect();
    Ok(())
}

/// The counts per status of each consumer at `now`, at most
/// [`MAX_CONSUMERS`](dedup_core::admin::MAX_CONSUMERS) (the statement's limit): the rows of
/// `statement` (its one parameter "now"; its columns `consumer`, read by `consumer`, and
/// [`status_counts`]).
pub async fn consumers<B: SqlBackend>(
    pool: &Pool<B::Db>,
    statement: String,
    now: Timestamp,
    consumer: fn(&RowOf<B>) -> Result<String>,
) -> Result<Vec<ConsumerCounts>> {
    let at = [Param::Int(Some(now.as_millis()))];
    B::Db::fetch_all(pool, AssertSqlSafe(statement), &at)
        .await
        .map_err(B::error)?
        .iter()
        .map(|row| {
            let mut counts = ConsumerCounts::new(consumer(row)?, now);
            read_counts::<B::Db>(row, &mut counts.counts, B::error)?;
            Ok(counts)
        })
        .collect()
}

/// What a purge with `retention` would remove now: the purge batches' own condition and
/// cutoff, counted by `statement` (its parameters the store's "now", `clock_ms`, and the
/// retention in ms; its columns `completed` and `expired`).
pub async fn purgeable<B: SqlBackend>(
    pool: &Pool<B::Db>,
    statement: SqlStr,
    clock_ms: Option<i64>,
    retention: Duration,
) -> Result<PurgeCount> {
    let params = [
        Param::Int(clock_ms),
        Param::Int(Some(retention_ms(retention))),
    ];
    let row = B::Db::fetch_one(pool, statement, &params)
        .await
        .map_err(B::error)?;
    Ok(PurgeCount {
        completed: count_of::<B::Db>(&row, "completed", B::error)?,
        expired: count_of::<B::Db>(&row, "expired", B::error)?,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A dialect whose SQL shows what it was asked (also used by `counts`' tests).
    pub(crate) struct Test;

    impl AdminDialect for Test {
        fn outcome_starts_with(hex: &str) -> String {
            format!("starts({hex})")
        }
        fn count_where(condition: &str) -> String {
            format!("count({condition})")
        }
    }

    #[test]
    fn every_status_has_its_own_condition() {
        let conditions: Vec<String> = Status::ALL
            .iter()
            .map(|s| status_condition::<Test>(Some(*s), "now"))
            .collect();
        for (i, c) in conditions.iter().enumerate() {
            assert!(!conditions[..i].contains(c), "{c} repeated");
        }
        assert_eq!(status_condition::<Test>(None, "now"), "TRUE");
        let failed = status_condition::<Test>(Some(Status::Failed), "now");
        assert!(
            failed.contains(&format!("starts({FAILED_PREFIX_HEX})")),
            "{failed}"
        );
        let completed = status_condition::<Test>(Some(Status::Completed), "now");
        assert!(completed.contains("NOT COALESCE("), "{completed}");
    }

    #[test]
    fn counts_are_named_in_status_order() {
        let counts = status_counts::<Test>("now");
        for i in 0..Status::ALL.len() {
            assert!(counts.contains(&format!(") AS n{i}")), "{counts}");
        }
        assert!(!counts.contains(&format!("n{}", Status::ALL.len())));
    }
}
