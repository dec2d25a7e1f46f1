//! Every statement the store runs, for its `` `table` ``.
//!
//! Identifiers cannot be bound as parameters, so the (validated, quoted) table name is
//! spliced into the text here; every value is a bind parameter. MySQL binds parameters by
//! position (`?`), so a statement that needs "now" repeats [`NOW_MS`] where it needs it,
//! each with its own `?` (the injected clock's milliseconds or NULL for the server's
//! clock); the server's clock is the statement's start time, the same at every use.
//! Statements over several keys name them as a row-constructor list, `(consumer,
//! message_id) IN ((?, ?), ...)`, which both MariaDB and MySQL read as one primary-key
//! lookup per key; a statement over one key names its columns instead (MariaDB 10.11 plans
//! an `UPDATE` or `DELETE` over a one-row list as a scan).
//!
//! No hot statement uses a derived table (`FROM (SELECT ...) q`): MariaDB materializes
//! each one into a temporary table at every execution, which cost about 0.6 ms per derived
//! table per statement on the bench machine, six times the cost of the one-row insert
//! itself.

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

/// "Now" in milliseconds since the Unix epoch: the bound clock `?`, else the server's
/// clock. `UTC_TIMESTAMP(6)` is the time the statement started, in UTC whatever the
/// session's `time_zone`; `TIMESTAMPDIFF` on it is calendar arithmetic, exact to the
/// microsecond (no floating point, no time-zone conversion, unlike
/// `UNIX_TIMESTAMP(NOW(6))`, which converts from the session's zone). The one definition of
/// "now" for the store's statements and the operator's reads.
pub(crate) const NOW_MS: &str = "COALESCE(CAST(? AS SIGNED), \
     CAST(TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 AS SIGNED))";

/// Begins the store's own transactions (lease mode, purge, the operator's writes): READ
/// COMMITTED, whatever the session's default, so a locking read of an absent key takes no
/// gap lock (which would make concurrent inserts of neighbouring keys deadlock). One round
/// trip (sqlx sends it as one multi-statement text query).
pub(crate) const BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";

/// The record's columns, in the order [`crate::decode`] reads them and the inserts write
/// them.
pub(crate) const COLUMNS: [&str; 12] = [
    "consumer",
    "message_id",
    "token",
    "fence",
    "attempt",
    "claimed_at",
    "expires_at",
    "processed_at",
    "outcome",
    "fingerprint",
    "first_claimed_at",
    "last_failure",
];

/// The columns qualified by `alias` (`"t."` or `""`).
pub(crate) fn row_cols(alias: &str) -> String {
    COLUMNS
        .iter()
        .map(|c| format!("{alias}{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `n` keys as a row-constructor list, `(consumer, message_id) IN ((?, ?), ...)`: `2 n`
/// parameters, consumer then message id. One primary-key lookup per key.
fn keys_in(n: usize) -> String {
    format!(
        "(consumer, message_id) IN ({})",
        vec!["(?, ?)"; n].join(", ")
    )
}

/// Which records are purgeable at the cutoff `c.cutoff` (now less the retention):
/// completed before it, or in flight with a lease that expired before it. `claimed_at`
/// comes first, for its index: a record is claimed before it is completed or its lease
/// expires, so every purgeable record has `claimed_at` before the cutoff. One text for the
/// purge batch and for counting what a purge would remove.
const PURGEABLE: &str = "t.claimed_at < c.cutoff \
     AND (t.processed_at < c.cutoff OR (t.processed_at IS NULL AND t.expires_at < c.cutoff))";

/// [`PURGEABLE`] without a derived table: the cutoff (now less the retention) written out
/// at each use. Parameters: now and the retention, three times over.
fn purgeable_inline() -> String {
    let cutoff = format!("({NOW_MS} - ?)");
    format!(
        "claimed_at < {cutoff} AND (processed_at < {cutoff} \
         OR (processed_at IS NULL AND expires_at < {cutoff}))"
    )
}

/// The text of [`Statements::claim_fresh`] for `table`.
fn fresh_insert(table: &str, n: usize) -> String {
    let row = format!(
        "(?, ?, ?, 1, 1, LAST_INSERT_ID({NOW_MS}), {NOW_MS} + ?, NULL, NULL, ?, {NOW_MS}, NULL)"
    );
    format!(
        "INSERT INTO {table} ({}) VALUES {}",
        row_cols(""),
        vec![row; n].join(", ")
    )
}

/// A statement built once, shared by every call (cloning it copies a pointer).
fn sql(text: String) -> SqlStr {
    // Safe: the only spliced text is the table name, validated by
    // `dedup_core::backend::names::sql_identifier` and quoted.
    SqlSafeStr::into_sql_str(AssertSqlSafe(std::sync::Arc::<str>::from(text)))
}

/// How many times a statement built on [`purgeable_inline`] takes now and the retention.
pub(crate) const CUTOFF_USES: usize = 3;

/// The statements of one store. The fixed ones are built once; those over `n` keys are
/// built per call (sqlx caches each prepared text per connection).
#[derive(Debug)]
pub(crate) struct Statements {
    table: String,
    /// Read one record, unlocked (`get`).
    pub(crate) get: String,
    /// "Now", alone: for a read that found no row to carry it.
    pub(crate) now: String,
    /// The caller's transactional claim (see [`Statements::new`]). Parameters: consumer,
    /// message id, now, now, fingerprint, now.
    pub(crate) claim_in_tx: String,
    /// Commit a lease by its token (in the caller's transaction, or alone: the lease-mode
    /// fast path). Parameters: now, outcome, consumer, message id, token.
    pub(crate) commit_in_tx: SqlStr,
    /// [`claim_fresh`](Self::claim_fresh) of one key, built once: the single claim's fast
    /// path.
    pub(crate) claim_fresh_one: SqlStr,
    /// Renew a lease held by its token, the new expiry reported as `LAST_INSERT_ID`.
    /// Parameters: now, extension (ms), consumer, message id, token.
    pub(crate) renew: String,
    /// Release a lease held by its token. Parameters: now, consumer, message id, token.
    pub(crate) release: String,
    /// Release a lease held by its token, keeping a failure on the record.
    pub(crate) release_failed: String,
    /// One purge batch's victims, locked, skipping rows others hold (MySQL). Parameters:
    /// now and retention three times, the cursor, the limit.
    pub(crate) purge_select: String,
    /// One purge batch as one statement (MariaDB): the victims deleted in `claimed_at`
    /// order, returning what the report and the cursor need. Parameters: as
    /// `purge_select`.
    pub(crate) purge_delete: String,
    /// Count what a purge would remove now.
    pub(crate) count_purgeable: String,
}

impl Statements {
    /// The statements for `table`, already quoted (`` `t` ``).
    pub(crate) fn new(table: &str) -> Self {
        let cols = row_cols("");
        // The transactional claim: the insert of a completed record (fence 1, no token),
        // or, on a duplicate key, the takeover of an expired lease with compatible
        // fingerprints (the claim's "now" is VALUES(claimed_at)). ON DUPLICATE KEY UPDATE
        // assigns left to right and later expressions see the new values: the first
        // assignment decides (an expired lease's expires_at becomes NULL while its
        // processed_at is still NULL, a state no stored record has), the others test for
        // that state, processed_at last. LAST_INSERT_ID reports what happened in the
        // statement's insert id: 1 for an insert (the VALUES row sets it; a duplicate
        // evaluates it too, then the update overwrites it), the new fence (2 or more) for
        // a takeover, 0 for a duplicate left alone. So a fresh key is one statement, with
        // no read.
        let takeover = "processed_at IS NULL AND expires_at <= VALUES(claimed_at) \
             AND (VALUES(fingerprint) IS NULL OR fingerprint IS NULL \
                  OR fingerprint = VALUES(fingerprint))";
        let mine = "(expires_at IS NULL AND processed_at IS NULL)";
        let claim_in_tx = format!(
            "INSERT INTO {table} ({cols}) \
             VALUES (?, ?, NULL, LAST_INSERT_ID(1), 1, {NOW_MS}, NULL, {NOW_MS}, NULL, ?, {NOW_MS}, NULL) \
             ON DUPLICATE KEY UPDATE \
               expires_at = IF({takeover}, NULL, expires_at), \
               fence = IF({mine}, LAST_INSERT_ID(fence + 1), fence + LAST_INSERT_ID(0)), \
               attempt = IF({mine}, attempt + 1, attempt), \
               claimed_at = IF({mine}, VALUES(claimed_at), claimed_at), \
               outcome = IF({mine}, NULL, outcome), \
               fingerprint = IF({mine}, COALESCE(VALUES(fingerprint), fingerprint), fingerprint), \
               token = IF({mine}, NULL, token), \
               processed_at = IF({mine}, VALUES(processed_at), processed_at)"
        );
        let commit_in_tx = format!(
            "UPDATE {table} SET processed_at = {NOW_MS}, expires_at = NULL, outcome = ? \
             WHERE consumer = ? AND message_id = ? AND token = ? AND processed_at IS NULL"
        );
        let renew = format!(
            "UPDATE {table} SET expires_at = LAST_INSERT_ID({NOW_MS} + ?) \
             WHERE consumer = ? AND message_id = ? AND token = ? AND processed_at IS NULL"
        );
        let release = format!(
            "UPDATE {table} SET expires_at = LEAST(expires_at, {NOW_MS}) \
             WHERE consumer = ? AND message_id = ? AND token = ? AND processed_at IS NULL"
        );
        let release_failed = format!(
            "UPDATE {table} SET last_failure = ?, expires_at = LEAST(expires_at, {NOW_MS}) \
             WHERE consumer = ? AND message_id = ? AND token = ? AND processed_at IS NULL"
        );
        let get = format!("SELECT {cols} FROM {table} WHERE consumer = ? AND message_id = ?");
        // Both walk the claimed_at index from the cursor `?` (the largest claimed_at the
        // previous batch removed), oldest claim first, so a long purge never rescans what
        // it passed. SKIP LOCKED passes over rows a claim or another purger holds.
        let purgeable = purgeable_inline();
        let purge_select = format!(
            "SELECT consumer, message_id, processed_at, claimed_at FROM {table} \
             WHERE {purgeable} AND claimed_at >= ? \
             ORDER BY claimed_at LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        let purge_delete = format!(
            "DELETE FROM {table} WHERE {purgeable} AND claimed_at >= ? \
             ORDER BY claimed_at LIMIT ? RETURNING processed_at, claimed_at"
        );
        let count_purgeable = format!(
            "SELECT CAST(COALESCE(SUM(t.processed_at IS NOT NULL), 0) AS SIGNED) AS completed, \
                    CAST(COALESCE(SUM(t.processed_at IS NULL), 0) AS SIGNED) AS expired \
             FROM (SELECT {NOW_MS} - ? AS cutoff) c STRAIGHT_JOIN {table} t WHERE {PURGEABLE}"
        );
        let claim_fresh_one = fresh_insert(table, 1);
        Statements {
            table: table.to_owned(),
            claim_fresh_one: sql(claim_fresh_one),
            get,
            now: format!("SELECT {NOW_MS} AS now_ms"),
            claim_in_tx,
            commit_in_tx: sql(commit_in_tx),
            renew,
            release,
            release_failed,
            purge_select,
            purge_delete,
            count_purgeable,
        }
    }

    /// Read the records of `n` keys with "now": one row per key found, `now_ms` first
    /// (a read that finds none runs [`now`](Self::now) instead), then the session's
    /// `LAST_INSERT_ID()` as `last_id` (see `crate::store::last_insert_id`). Parameters: now, then the
    /// `2 n` key parts. `locking`: `FOR UPDATE` (the rows found stay locked until the
    /// transaction ends; at READ COMMITTED, absent keys lock nothing).
    pub(crate) fn read(&self, n: usize, locking: bool) -> String {
        let filter = if n == 1 {
            "consumer = ? AND message_id = ?".to_owned()
        } else {
            keys_in(n)
        };
        format!(
            "SELECT {NOW_MS} AS now_ms, LAST_INSERT_ID() AS last_id, {} FROM {} WHERE {filter}{}",
            row_cols(""),
            self.table,
            if locking { " FOR UPDATE" } else { "" }
        )
    }

    /// Insert `n` new records (all [`COLUMNS`] per record); with `replace`, records that
    /// exist (and that the transaction holds locked) are overwritten instead.
    pub(crate) fn write(&self, n: usize, replace: bool) -> String {
        let row = format!("({})", vec!["?"; COLUMNS.len()].join(", "));
        let mut sql = format!(
            "INSERT INTO {} ({}) VALUES {}",
            self.table,
            row_cols(""),
            vec![row; n].join(", ")
        );
        if replace {
            sql.push_str(" ON DUPLICATE KEY UPDATE ");
            let sets: Vec<String> = COLUMNS[2..]
                .iter()
                .map(|c| format!("{c} = VALUES({c})"))
                .collect();
            sql.push_str(&sets.join(", "));
        }
        sql
    }

    /// The fast path of claims of `n` new keys: one plain multi-row insert of fresh leases
    /// (fence 1, attempt 1), failing with a duplicate key when any key has a record (the
    /// caller then takes the general path). "Now" is reported as `LAST_INSERT_ID` (MySQL
    /// hands the value of `LAST_INSERT_ID(expr)` to the client as the statement's insert
    /// id), so no read follows. Parameters per key: consumer, message id, token, now, now,
    /// lease (ms), fingerprint, now.
    pub(crate) fn claim_fresh(&self, n: usize) -> String {
        fresh_insert(&self.table, n)
    }

    /// The fast path of commits of `n` leases on distinct keys, none with an outcome: each
    /// row still held by its token is completed; the matched count says whether all were.
    /// Parameters: now, then per key consumer, message id, token.
    pub(crate) fn commit_held(&self, n: usize) -> String {
        // One lease by its columns: MariaDB 10.11 plans an `UPDATE` over a one-row `IN`
        // list as a scan of the whole primary key, though not a longer list.
        let filter = match n {
            1 => "consumer = ? AND message_id = ? AND token = ?".to_owned(),
            _ => format!(
                "(consumer, message_id, token) IN ({})",
                vec!["(?, ?, ?)"; n].join(", ")
            ),
        };
        format!(
            "UPDATE {} SET processed_at = {NOW_MS}, expires_at = NULL, outcome = NULL \
             WHERE {filter} AND processed_at IS NULL",
            self.table,
        )
    }

    /// [`commit_held`](Self::commit_held) for leases with outcomes: the keys, tokens and
    /// outcomes as a derived table joined by primary key (an outcome per row needs one).
    /// Parameters: per key consumer, message id, token, outcome; then now.
    pub(crate) fn commit_held_outcomes(&self, n: usize) -> String {
        let mut keys = String::from("(SELECT ? AS c, ? AS m, ? AS tok, ? AS o");
        for _ in 1..n {
            keys.push_str(" UNION ALL SELECT ?, ?, ?, ?");
        }
        keys.push_str(") q");
        format!(
            "UPDATE {} t JOIN {keys} ON t.consumer = q.c AND t.message_id = q.m \
             CROSS JOIN (SELECT {NOW_MS} AS ms) n \
             SET t.processed_at = n.ms, t.expires_at = NULL, t.outcome = q.o \
             WHERE t.token = q.tok AND t.processed_at IS NULL",
            self.table
        )
    }

    /// Delete the records of `n` keys (parameters: the key parts). One key is named by
    /// its columns: MariaDB 10.11 plans a `DELETE` over a one-row `IN` list as a full scan
    /// (which locks every row it passes, so concurrent forgets deadlock), though not a
    /// longer list.
    pub(crate) fn delete(&self, n: usize) -> String {
        let filter = match n {
            1 => "consumer = ? AND message_id = ?".to_owned(),
            _ => keys_in(n),
        };
        format!("DELETE FROM {} WHERE {filter}", self.table)
    }
}
