//! Every statement the store runs, for its `` `table` ``.
//!
//! Identifiers cannot be bound as parameters, so the (validated, quoted) table name is
//! spliced into the text here; every value is a bind parameter. MySQL binds parameters by
//! position (`?`), so a statement that needs "now" reads it once, in a one-row derived
//! table `n(ms)`, whose `?` is the injected clock's milliseconds or NULL for the server's
//! clock. Statements over several keys take them as a derived table `q(c, m)` of `UNION
//! ALL` rows joined to the table by primary key: one index lookup per key, whatever the
//! optimizer's statistics say.

use std::time::Duration;

use dedup_core::duration_millis;

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
pub(crate) const COLUMNS: [&str; 11] = [
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
];

/// The columns qualified by `alias` (`"t."` or `""`).
pub(crate) fn row_cols(alias: &str) -> String {
    COLUMNS
        .iter()
        .map(|c| format!("{alias}{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A purge's retention in milliseconds, clamped so "now - retention" cannot overflow.
pub(crate) fn retention_param(retention: Duration) -> i64 {
    duration_millis(retention).min(i64::MAX / 4)
}

/// `n` keys as a derived table `q(c, m)`: `2 n` parameters, consumer then message id.
fn keys_table(n: usize) -> String {
    let mut out = String::from("(SELECT ? AS c, ? AS m");
    for _ in 1..n {
        out.push_str(" UNION ALL SELECT ?, ?");
    }
    out.push_str(") q");
    out
}

/// Which records are purgeable at the cutoff `c.cutoff` (now less the retention):
/// completed before it, or in flight with a lease that expired before it. `claimed_at`
/// comes first, for its index: a record is claimed before it is completed or its lease
/// expires, so every purgeable record has `claimed_at` before the cutoff. One text for the
/// purge batch and for counting what a purge would remove.
const PURGEABLE: &str = "t.claimed_at < c.cutoff \
     AND (t.processed_at < c.cutoff OR (t.processed_at IS NULL AND t.expires_at < c.cutoff))";

/// The statements of one store. The fixed ones are built once; those over `n` keys are
/// built per call (sqlx caches each prepared text per connection).
#[derive(Debug)]
pub(crate) struct Statements {
    table: String,
    /// Read one record, unlocked (`get`).
    pub(crate) get: String,
    /// The caller's transactional claim: an insert of a completed record carrying a
    /// marker token, or the takeover of an expired lease, locking the row either way.
    pub(crate) claim_in_tx: String,
    /// Clear the marker token of a transactional claim that wrote.
    pub(crate) clear_marker: String,
    /// Commit a lease by its token (in the caller's transaction, or alone: the lease-mode
    /// fast path). Parameters: now, outcome, consumer, message id, token.
    pub(crate) commit_in_tx: String,
    /// Renew a lease held by its token, the new expiry reported as `LAST_INSERT_ID`.
    /// Parameters: now, extension (ms), consumer, message id, token.
    pub(crate) renew: String,
    /// Release a lease held by its token. Parameters: now, consumer, message id, token.
    pub(crate) release: String,
    /// One purge batch's victims, locked, skipping rows others hold.
    pub(crate) purge_select: String,
    /// Count what a purge would remove now.
    pub(crate) count_purgeable: String,
}

impl Statements {
    /// The statements for `table`, already quoted (`` `t` ``).
    pub(crate) fn new(table: &str) -> Self {
        let cols = row_cols("");
        // The takeover condition of a claim: in flight, lease expired by the claim's "now"
        // (VALUES(claimed_at)), fingerprints compatible. ON DUPLICATE KEY UPDATE assigns
        // left to right and later expressions see the new values, so only the first
        // assignment tests it; it installs this statement's own token, which no other
        // record can carry, and the others test for that token.
        let takeover = "processed_at IS NULL AND expires_at <= VALUES(claimed_at) \
             AND (VALUES(fingerprint) IS NULL OR fingerprint IS NULL \
                  OR fingerprint = VALUES(fingerprint))";
        let mine = "token <=> VALUES(token)";
        let claim_in_tx = format!(
            "INSERT INTO {table} ({cols}) \
             SELECT ?, ?, ?, 1, 1, n.ms, NULL, n.ms, NULL, ?, n.ms FROM (SELECT {NOW_MS} AS ms) n \
             ON DUPLICATE KEY UPDATE \
               token = IF({takeover}, VALUES(token), token), \
               fence = IF({mine}, fence + 1, fence), \
               attempt = IF({mine}, attempt + 1, attempt), \
               claimed_at = IF({mine}, VALUES(claimed_at), claimed_at), \
               expires_at = IF({mine}, NULL, expires_at), \
               processed_at = IF({mine}, VALUES(processed_at), processed_at), \
               outcome = IF({mine}, NULL, outcome), \
               fingerprint = IF({mine}, COALESCE(VALUES(fingerprint), fingerprint), fingerprint)"
        );
        let clear_marker = format!(
            "UPDATE {table} SET token = NULL WHERE consumer = ? AND message_id = ? AND token = ?"
        );
        let commit_in_tx = format!(
            "UPDATE {table} t CROSS JOIN (SELECT {NOW_MS} AS ms) n \
             SET t.processed_at = n.ms, t.expires_at = NULL, t.outcome = ? \
             WHERE t.consumer = ? AND t.message_id = ? AND t.token = ? AND t.processed_at IS NULL"
        );
        let renew = format!(
            "UPDATE {table} t CROSS JOIN (SELECT {NOW_MS} AS ms) n \
             SET t.expires_at = LAST_INSERT_ID(n.ms + ?) \
             WHERE t.consumer = ? AND t.message_id = ? AND t.token = ? AND t.processed_at IS NULL"
        );
        let release = format!(
            "UPDATE {table} t CROSS JOIN (SELECT {NOW_MS} AS ms) n \
             SET t.expires_at = LEAST(t.expires_at, n.ms) \
             WHERE t.consumer = ? AND t.message_id = ? AND t.token = ? AND t.processed_at IS NULL"
        );
        let get = format!("SELECT {cols} FROM {table} WHERE consumer = ? AND message_id = ?");
        // Walks the claimed_at index from the cursor `?` (the largest claimed_at the
        // previous batch removed), oldest claim first, so a long purge never rescans what
        // it passed. SKIP LOCKED passes over rows a claim or another purger holds.
        let purge_select = format!(
            "SELECT t.consumer, t.message_id, t.processed_at, t.claimed_at \
             FROM (SELECT {NOW_MS} - ? AS cutoff) c STRAIGHT_JOIN {table} t \
             WHERE {PURGEABLE} AND t.claimed_at >= ? \
             ORDER BY t.claimed_at LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        let count_purgeable = format!(
            "SELECT CAST(COALESCE(SUM(t.processed_at IS NOT NULL), 0) AS SIGNED) AS completed, \
                    CAST(COALESCE(SUM(t.processed_at IS NULL), 0) AS SIGNED) AS expired \
             FROM (SELECT {NOW_MS} - ? AS cutoff) c STRAIGHT_JOIN {table} t WHERE {PURGEABLE}"
        );
        Statements {
            table: table.to_owned(),
            get,
            claim_in_tx,
            clear_marker,
            commit_in_tx,
            renew,
            release,
            purge_select,
            count_purgeable,
        }
    }

    /// Read the records of `n` keys with "now": one row per key (`NULL` record columns
    /// for an absent key), `now_ms` first. Parameters: the `2 n` key parts, then now.
    /// `locking`: `FOR UPDATE` (the rows found stay locked until the transaction ends).
    pub(crate) fn read(&self, n: usize, locking: bool) -> String {
        format!(
            "SELECT n.ms AS now_ms, {} FROM {} CROSS JOIN (SELECT {NOW_MS} AS ms) n \
             LEFT JOIN {} t ON t.consumer = q.c AND t.message_id = q.m{}",
            row_cols("t."),
            keys_table(n),
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

    /// The fast path of claims of `n` new keys: one plain insert of fresh leases (fence 1,
    /// attempt 1), failing with a duplicate key when any key has a record (the caller then
    /// takes the general path). "Now" is reported as `LAST_INSERT_ID` (MySQL hands the
    /// value of `LAST_INSERT_ID(expr)` in an `INSERT ... SELECT` to the client as the
    /// statement's insert id), so no read follows. Parameters: per key consumer, message
    /// id, token, lease (ms), fingerprint; then now.
    pub(crate) fn claim_fresh(&self, n: usize) -> String {
        let mut keys = String::from("(SELECT ? AS c, ? AS m, ? AS tok, ? AS l, ? AS f");
        for _ in 1..n {
            keys.push_str(" UNION ALL SELECT ?, ?, ?, ?, ?");
        }
        keys.push_str(") q");
        format!(
            "INSERT INTO {} ({}) \
             SELECT q.c, q.m, q.tok, 1, 1, n.ms, n.ms + q.l, NULL, NULL, q.f, n.ms \
             FROM {keys} CROSS JOIN (SELECT LAST_INSERT_ID({NOW_MS}) AS ms) n",
            self.table,
            row_cols(""),
        )
    }

    /// The fast path of commits of `n` leases on distinct keys: each row still held by its
    /// token is completed; the matched count says whether all were. Parameters: per key
    /// consumer, message id, token, outcome; then now.
    pub(crate) fn commit_held(&self, n: usize) -> String {
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

    /// Delete the records of `n` keys (parameters: the key parts).
    pub(crate) fn delete(&self, n: usize) -> String {
        format!(
            "DELETE t FROM {} t JOIN {} ON t.consumer = q.c AND t.message_id = q.m",
            self.table,
            keys_table(n)
        )
    }
}
