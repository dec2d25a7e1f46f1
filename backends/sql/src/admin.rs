//! The operator's reads ([`AdminStorage`](dedup_core::backend::AdminStorage)) both sqlx
//! backends share: the conditions selecting records by [`Status`], the counts per status in
//! one aggregate row, and reading those counts back. A backend supplies how its SQL tests
//! an outcome's prefix and counts rows ([`AdminDialect`]).

use dedup_core::admin::{Stats, Status};
use dedup_core::backend::{DEAD_LETTER_PREFIX_HEX, FAILED_PREFIX_HEX};
use dedup_core::{Error, Result, Timestamp};
use sqlx::{ColumnIndex, Decode, Pool, Row, Type};

use crate::error::SqlBackend;
use crate::query::SqlDb;

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
pub fn read_counts<R>(row: &R, stats: &mut Stats, error: fn(sqlx::Error) -> Error) -> Result<()>
where
    R: Row,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'n> &'n str: ColumnIndex<R>,
{
    for (i, status) in Status::ALL.iter().enumerate() {
        *stats.count_mut(*status) = count_of(row, &format!("n{i}"), error)?;
    }
    Ok(())
}

/// The count in column `name` of `row` (a negative one, which no count is, as 0).
pub fn count_of<R>(row: &R, name: &str, error: fn(sqlx::Error) -> Error) -> Result<u64>
where
    R: Row,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'n> &'n str: ColumnIndex<R>,
{
    let n: i64 = row.try_get(name).map_err(error)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Test;

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
