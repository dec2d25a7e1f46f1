//! Kept counts (opt-in: `Admin::enable_counts`, `dedup counts enable`): what SQLite adds to
//! a store so the operator's counts stop reading every record, and how they are read.
//!
//! Enabling adds, beside the records table `T`:
//! - `T_counts`, one row per consumer: its in-flight (live or expired), processed, failed
//!   and dead-lettered records;
//! - three row triggers keeping it: an insert adds the new record's class, a delete takes
//!   the old one's away, an update whose class (or consumer) changed does both (a renewal,
//!   a release or a takeover changes no class and runs nothing). SQLite has one writer at a
//!   time, so one row per consumer makes no writer wait longer;
//! - `T_in_flight_idx`, a partial index of the in-flight records on `(expires_at,
//!   consumer, message_id)`: the expired leases and the oldest live one (ties in key
//!   order) are read through it.
//!
//! What it costs the consumers: a claim of a new key, a commit, a purged or forgotten
//! record each write the counts row (an upsert) in the same transaction, and the partial
//! index is written by claims, commits, renewals and releases. Without kept counts the
//! store has none of it; disabling drops all of it.

use dedup_core::admin::{ConsumerCounts, Status};
use dedup_core::backend::{DEAD_LETTER_PREFIX_HEX, FAILED_PREFIX_HEX};
use dedup_core::{Result, Timestamp};
use rusqlite::{Connection, TransactionBehavior, params};

use crate::error::backend;

/// The kept classes, in the counts table's column order (a record's class is its index).
const KEPT: [&str; 4] = ["in_flight", "completed", "failed", "dead_lettered"];

/// The class (an index into [`KEPT`]) of the record `row` (`NEW`, `OLD` or empty for the
/// table's own columns), as SQL.
fn class_of(row: &str) -> String {
    let prefix = |hex: &str| format!("substr({row}outcome, 1, {}) = X'{hex}'", hex.len() / 2);
    format!(
        "(CASE WHEN {row}state = 'in_flight' THEN 0 WHEN {} THEN 2 WHEN {} THEN 3 ELSE 1 END)",
        prefix(FAILED_PREFIX_HEX),
        prefix(DEAD_LETTER_PREFIX_HEX),
    )
}

/// One statement adding (`sign` `""`) or taking away (`"-"`) the record `row`'s class in
/// its consumer's counts row.
fn upsert(row: &str, sign: &str) -> String {
    let class = class_of(&format!("{row}."));
    let values: Vec<String> = (0..KEPT.len())
        .map(|i| format!("{sign}({class} = {i})"))
        .collect();
    let add: Vec<String> = KEPT
        .iter()
        .map(|c| format!("{c} = {c} + excluded.{c}"))
        .collect();
    format!(
        "INSERT INTO \"{{kept}}\" VALUES ({row}.consumer, {}) \
         ON CONFLICT (consumer) DO UPDATE SET {};",
        values.join(", "),
        add.join(", ")
    )
}

/// What [`enable`] runs, in one immediate transaction; `{table}`, `{kept}` and the
/// statements' placeholders are filled in by [`render`].
const ENABLE: &str = "CREATE TABLE \"{kept}\" (
    consumer      TEXT    PRIMARY KEY NOT NULL,
    in_flight     INTEGER NOT NULL,
    completed     INTEGER NOT NULL,
    failed        INTEGER NOT NULL,
    dead_lettered INTEGER NOT NULL
);
CREATE TRIGGER \"{table}_counts_ins\" AFTER INSERT ON \"{table}\" BEGIN {add_new} END;
CREATE TRIGGER \"{table}_counts_upd\" AFTER UPDATE ON \"{table}\"
    WHEN {class_old} <> {class_new} OR OLD.consumer <> NEW.consumer
    BEGIN {take_old} {add_new} END;
CREATE TRIGGER \"{table}_counts_del\" AFTER DELETE ON \"{table}\" BEGIN {take_old} END;
CREATE INDEX \"{table}_in_flight_idx\" ON \"{table}\" (expires_at, consumer, message_id)
    WHERE state = 'in_flight';
INSERT INTO \"{kept}\" SELECT consumer, {sums} FROM (
    SELECT consumer, {class} AS class FROM \"{table}\") GROUP BY consumer;";

/// What [`disable`] runs: everything [`ENABLE`] created, dropped.
const DISABLE: &str = "DROP TRIGGER \"{table}_counts_ins\";
DROP TRIGGER \"{table}_counts_upd\";
DROP TRIGGER \"{table}_counts_del\";
DROP INDEX \"{table}_in_flight_idx\";
DROP TABLE \"{kept}\";";

/// `template` for `table`, its placeholders filled in.
fn render(template: &str, table: &str) -> String {
    let sums: Vec<String> = (0..KEPT.len())
        .map(|i| format!("sum(class = {i})"))
        .collect();
    template
        .replace("{add_new}", &upsert("NEW", ""))
        .replace("{take_old}", &upsert("OLD", "-"))
        .replace("{class_old}", &class_of("OLD."))
        .replace("{class_new}", &class_of("NEW."))
        .replace("{class}", &class_of(""))
        .replace("{sums}", &sums.join(", "))
        .replace("{kept}", &kept_table(table))
        .replace("{table}", table)
}

/// The counts table of the records table `table`.
fn kept_table(table: &str) -> String {
    format!("{table}_counts")
}

/// Whether the store of `table` keeps counts (its counts table exists).
pub(crate) fn kept(conn: &Connection, table: &str) -> Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
        [kept_table(table)],
        |r| r.get(0),
    )
    .map_err(backend)
}

/// Run `template` in one immediate transaction (the migration's lock) if the counts table's
/// presence is `present`; `Ok(false)` otherwise, nothing changed.
fn change(conn: &mut Connection, table: &str, present: bool, template: &str) -> Result<bool> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(backend)?;
    if kept(&tx, table)? != present {
        return Ok(false);
    }
    tx.execute_batch(&render(template, table))
        .map_err(backend)?;
    tx.commit().map_err(backend)?;
    Ok(true)
}

/// Start keeping counts for `table`: see the module's docs. The starting counts are read in
/// the same transaction, which holds the write lock.
pub(crate) fn enable(conn: &mut Connection, table: &str) -> Result<bool> {
    change(conn, table, false, ENABLE)
}

/// Stop keeping counts for `table`: drop what [`enable`] created.
pub(crate) fn disable(conn: &mut Connection, table: &str) -> Result<bool> {
    change(conn, table, true, DISABLE)
}

/// The kept counts per consumer at `now` (at most `limit`, in byte order), the expired
/// leases counted through the partial index.
pub(crate) fn read(
    conn: &Connection,
    table: &str,
    now: Timestamp,
    limit: Option<usize>,
) -> Result<Vec<ConsumerCounts>> {
    let sql = format!(
        "SELECT k.consumer, k.in_flight - coalesce(e.n, 0), coalesce(e.n, 0), \
                k.completed, k.failed, k.dead_lettered \
         FROM \"{kept}\" k LEFT JOIN ( \
             SELECT consumer, count(*) AS n FROM \"{table}\" \
             WHERE state = 'in_flight' AND expires_at <= ?1 GROUP BY consumer) e \
         ON e.consumer = k.consumer \
         WHERE k.in_flight + k.completed + k.failed + k.dead_lettered > 0 \
         ORDER BY k.consumer LIMIT ?2",
        kept = kept_table(table),
    );
    let limit = limit.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
    let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
    let rows = stmt
        .query_map(params![now.as_millis(), limit], |r| {
            let mut counts = ConsumerCounts::new(r.get::<_, String>(0)?, now);
            for (i, status) in Status::ALL.iter().enumerate() {
                let n: i64 = r.get(i + 1)?;
                *counts.counts.count_mut(*status) = u64::try_from(n).unwrap_or(0);
            }
            Ok(counts)
        })
        .map_err(backend)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(backend)?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enabling_and_disabling_leave_the_schema_as_it_was() {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::schema::migrate(&mut conn, "t").unwrap();
        let schema = |conn: &Connection| -> Vec<String> {
            let mut stmt = conn
                .prepare("SELECT type || ' ' || name FROM sqlite_master ORDER BY 1")
                .unwrap();
            stmt.query_map([], |r| r.get(0))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap()
        };
        let before = schema(&conn);
        assert!(enable(&mut conn, "t").unwrap());
        assert!(!enable(&mut conn, "t").unwrap(), "enabled twice");
        assert!(kept(&conn, "t").unwrap());
        assert_eq!(schema(&conn).len(), before.len() + 6, "{:?}", schema(&conn));
        assert!(disable(&mut conn, "t").unwrap());
        assert!(!disable(&mut conn, "t").unwrap(), "disabled twice");
        assert_eq!(schema(&conn), before);
    }

    #[test]
    fn the_expired_leases_are_read_through_the_partial_index() {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::schema::migrate(&mut conn, "t").unwrap();
        enable(&mut conn, "t").unwrap();
        let plan: Vec<String> = conn
            .prepare(
                "EXPLAIN QUERY PLAN SELECT consumer, count(*) FROM \"t\" \
                 WHERE state = 'in_flight' AND expires_at <= 5 GROUP BY consumer",
            )
            .unwrap()
            .query_map([], |r| r.get(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let plan = plan.join("\n");
        assert!(plan.contains("t_in_flight_idx"), "{plan}");
        assert!(
            !plan.contains("SCAN t\n") && !plan.ends_with("SCAN t"),
            "{plan}"
        );
    }
}
