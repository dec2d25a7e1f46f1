//! Kept counts (opt-in, `Admin::enable_counts`) as both sqlx backends read them: the
//! classes a record is counted in, the expressions counting them, and the read that
//! turns the kept counts plus the expired leases into [`ConsumerCounts`].
//!
//! A store that keeps counts has a counts table beside its records table, with one or more
//! rows per consumer (`consumer`, then one column per [`KEPT`] class): triggers append a
//! row of differences per writing statement, and the sum per consumer is the count. Which
//! in-flight record is expired depends on the time of the read, so the kept counts hold
//! every in-flight record as `in_flight`, and the read counts the expired ones through the
//! in-flight rows' partial index (`processed_at IS NULL`, on `expires_at`).
//!
//! The DDL (table, triggers, index) is each backend's own.

use dedup_core::admin::{ConsumerCounts, Status};
use dedup_core::{Error, Result, Timestamp};

use crate::admin::{AdminDialect, count_of, read_counts, status_condition};
use crate::query::SqlDb;

/// The kept classes, in the counts table's column order: in flight (live or expired),
/// processed, failed, dead-lettered.
pub const KEPT: [&str; 4] = ["in_flight", "completed", "failed", "dead_lettered"];

/// How many rows of differences beyond one per consumer a read leaves before it folds
/// them into one row per consumer (see [`needs_fold`]).
pub const FOLD_AFTER: u64 = 1_000;

/// What differs in one backend's SQL for reading kept counts.
pub trait CountsDialect: AdminDialect {
    /// `expr` as a 64-bit integer (sums of integers are wider on some servers).
    fn bigint(expr: &str) -> String;

    /// `column`, ordered by its bytes (the order every store lists consumers in).
    fn byte_order(column: &str) -> String;
}

/// The condition selecting the rows in the kept class `class` (one of [`KEPT`]).
fn class_condition<D: AdminDialect>(class: &str) -> String {
    match class {
        "in_flight" => "processed_at IS NULL".to_owned(),
        "completed" => status_condition::<D>(Some(Status::Completed), ""),
        "failed" => status_condition::<D>(Some(Status::Failed), ""),
        _ => status_condition::<D>(Some(Status::DeadLettered), ""),
    }
}

/// `SELECT` expressions counting the rows of each [`KEPT`] class, each multiplied by
/// `sign` (`""` or `"-"`) and named after its class: the counts of a set of rows (a whole
/// table, a trigger's old or new rows) as differences to add.
pub fn class_counts<D: AdminDialect>(sign: &str) -> String {
    KEPT.iter()
        .map(|class| {
            format!(
                "{sign}{} AS {class}",
                D::count_where(&class_condition::<D>(class))
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The condition "some class changed" over sums named as [`KEPT`] (a `HAVING` that drops
/// a consumer whose differences cancel out: a renewal, a release, a takeover).
pub fn any_change() -> String {
    KEPT.iter()
        .map(|class| format!("SUM({class}) <> 0"))
        .collect::<Vec<_>>()
        .join(" OR ")
}

/// The sums per consumer of the rows of `kept`, named as [`KEPT`] (the fold's `SELECT`).
pub fn sums<D: CountsDialect>() -> String {
    KEPT.iter()
        .map(|class| format!("{} AS {class}", D::bigint(&format!("SUM({class})"))))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The read: per consumer with records, in byte order (at most `limit` when given), its
/// counts in [`Status::ALL`] order as `n0`.. (as [`read_counts`] reads them) and the rows
/// of differences it has in `kept` (`deltas`). `table` is the records table, `now` the
/// read's "now" in ms (an SQL expression). The expired leases are the in-flight rows with
/// `expires_at <= now`, read through the partial index.
pub fn read_sql<D: CountsDialect>(
    kept: &str,
    table: &str,
    now: &str,
    limit: Option<usize>,
) -> String {
    let total = KEPT
        .iter()
        .map(|class| format!("SUM({class})"))
        .collect::<Vec<_>>()
        .join(" + ");
    let limit = limit.map(|n| format!(" LIMIT {n}")).unwrap_or_default();
    format!(
        "WITH k AS (SELECT consumer, {sums}, COUNT(*) AS deltas FROM {kept} \
             GROUP BY consumer HAVING {total} <> 0), \
         e AS (SELECT consumer, COUNT(*) AS n FROM {table} \
             WHERE processed_at IS NULL AND expires_at <= {now} GROUP BY consumer) \
         SELECT k.consumer AS consumer, {live} AS n0, {expired} AS n1, \
             k.completed AS n2, k.failed AS n3, k.dead_lettered AS n4, \
             {deltas} AS deltas \
         FROM k LEFT JOIN e ON e.consumer = k.consumer \
         ORDER BY {order}{limit}",
        sums = sums::<D>(),
        live = D::bigint("k.in_flight - COALESCE(e.n, 0)"),
        expired = D::bigint("COALESCE(e.n, 0)"),
        deltas = D::bigint("k.deltas"),
        order = D::byte_order("k.consumer"),
    )
}

/// The rows of [`read_sql`] as per-consumer counts at `now`, and the rows of differences
/// they were summed from; `consumer` reads a row's consumer, `error` maps a driver error.
pub fn read_rows<DB: SqlDb>(
    rows: &[DB::Row],
    now: Timestamp,
    consumer: fn(&DB::Row) -> Result<String>,
    error: fn(sqlx::Error) -> Error,
) -> Result<(Vec<ConsumerCounts>, u64)> {
    let mut deltas = 0;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let mut counts = ConsumerCounts::new(consumer(row)?, now);
        read_counts::<DB>(row, &mut counts.counts, error)?;
        deltas += count_of::<DB>(row, "deltas", error)?;
        out.push(counts);
    }
    Ok((out, deltas))
}

/// Whether a read that found `deltas` rows of differences for `consumers` consumers
/// should fold them (more than [`FOLD_AFTER`] rows beyond one per consumer).
pub fn needs_fold(deltas: u64, consumers: usize) -> bool {
    deltas > consumers as u64 + FOLD_AFTER
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::admin::tests::Test;

    impl CountsDialect for Test {
        fn bigint(expr: &str) -> String {
            format!("int({expr})")
        }
        fn byte_order(column: &str) -> String {
            format!("bytes({column})")
        }
    }

    #[test]
    fn every_class_is_counted_with_its_sign() {
        let minus = class_counts::<Test>("-");
        for class in KEPT {
            assert!(minus.contains(&format!(") AS {class}")), "{minus}");
        }
        assert_eq!(minus.matches("-count(").count(), KEPT.len(), "{minus}");
        assert!(minus.contains("count(processed_at IS NULL)"), "{minus}");
    }

    #[test]
    fn the_read_names_the_statuses_in_order() {
        let sql = read_sql::<Test>("kept", "records", "$1", Some(7));
        for i in 0..Status::ALL.len() {
            assert!(sql.contains(&format!(" AS n{i}")), "{sql}");
        }
        assert!(sql.contains("expires_at <= $1"), "{sql}");
        assert!(sql.ends_with("ORDER BY bytes(k.consumer) LIMIT 7"), "{sql}");
        assert!(!read_sql::<Test>("kept", "records", "$1", None).contains("LIMIT"));
    }

    #[test]
    fn folding_waits_for_enough_rows() {
        assert!(!needs_fold(FOLD_AFTER + 2, 2));
        assert!(needs_fold(FOLD_AFTER + 3, 2));
    }
}
