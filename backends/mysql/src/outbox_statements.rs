//! The outbox's statements, rendered for its `` `table` `` and its ordering keys' table.
//!
//! As for the records (see [`crate::statements`]): the validated, quoted names are spliced
//! in, every value is a bind parameter, and each use of "now" is [`NOW_MS`] with its own
//! `?` (the injected clock's milliseconds, or NULL for the server's clock). Statements over
//! `n` rows or ids are built per call (sqlx caches each prepared text per connection).

use dedup_sql::outbox::SharedStatements;
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::statements::NOW_MS;

/// A rendered statement for the shared layer. Safe: the only spliced text is the table
/// name, validated (ASCII letters, digits, '_') and quoted.
fn sql(text: String) -> SqlStr {
    AssertSqlSafe(text).into_sql_str()
}

/// The outbox row columns the dialect decodes (see
/// [`ROW_COLUMNS`](dedup_sql::outbox::ROW_COLUMNS)), qualified by `alias`.
fn row(alias: &str) -> String {
    dedup_sql::outbox::ROW_COLUMNS
        .iter()
        .map(|c| format!("{alias}{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `n` placeholders, `?, ?, ...`.
fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// The fence of every mark: the row still held by the bound token at the bound now.
fn held_by() -> String {
    format!("state = 'held' AND holder = ? AND held_until > {NOW_MS}")
}

/// The outbox statements of one store.
#[derive(Debug)]
pub(crate) struct OutboxStatements {
    table: String,
    keys: String,
    /// Rows of the take: due pending rows and held rows whose hold ran out, none while an
    /// earlier row of its key is pending or held, locked with `SKIP LOCKED`. Parameters:
    /// now (3 times), limit.
    pub(crate) take: String,
    /// An operator's listing. Parameters: after id, state (twice), destination (twice),
    /// limit.
    pub(crate) list: String,
    /// Record a failed publish. Parameters: error, dead, now, delay, dead, id, token, now.
    pub(crate) mark_failed: String,
}

impl OutboxStatements {
    /// The statements for the outbox table `table` and its keys table `keys` (quoted).
    pub(crate) fn new(table: &str, keys: &str) -> Self {
        let held_by = held_by();
        OutboxStatements {
            // A locking read never locks the subquery's rows (a plain read of the latest
            // committed rows): a row another take is holding is passed over, and its later
            // rows of the same key stay blocked by it, since it is pending or held in every
            // committed state.
            take: format!(
                "SELECT {NOW_MS} AS now_ms, {cols} FROM {table} c \
                 WHERE ((c.state = 'pending' AND c.due_at <= {NOW_MS}) \
                     OR (c.state = 'held' AND c.held_until <= {NOW_MS})) \
                   AND (c.ordering_key IS NULL OR NOT EXISTS ( \
                     SELECT 1 FROM {table} e \
                     WHERE e.ordering_key = c.ordering_key AND e.id < c.id \
                       AND e.state IN ('pending', 'held'))) \
                 ORDER BY c.due_at, c.id LIMIT ? \
                 FOR UPDATE SKIP LOCKED",
                cols = row("c."),
            ),
            list: format!(
                "SELECT {cols} FROM {table} \
                 WHERE id > ? AND (? IS NULL OR state = ?) \
                   AND (? IS NULL OR destination = ?) \
                 ORDER BY id LIMIT ?",
                cols = row(""),
            ),
            // MySQL assigns left to right: `due_at` and `state` read no column this
            // statement changes.
            mark_failed: format!(
                "UPDATE {table} SET last_error = ?, \
                   due_at = CASE WHEN ? THEN due_at ELSE {NOW_MS} + ? END, \
                   state = CASE WHEN ? THEN 'dead' ELSE 'pending' END, \
                   holder = NULL, held_until = NULL \
                 WHERE id = ? AND {held_by}"
            ),
            table: table.to_owned(),
            keys: keys.to_owned(),
        }
    }

    /// Lock `n` ordering keys (sorted) for the transaction: their rows in the keys table,
    /// inserted when new. Parameters: the keys.
    pub(crate) fn lock_keys(&self, n: usize) -> String {
        format!(
            "INSERT INTO {} (ordering_key) VALUES {} \
             ON DUPLICATE KEY UPDATE ordering_key = ordering_key",
            self.keys,
            vec!["(?)"; n].join(", ")
        )
    }

    /// Insert `n` messages in the given order; a message id already there writes nothing.
    /// Parameters per message: destination, message id, headers, payload, ordering key,
    /// now, now, delay in ms.
    pub(crate) fn enqueue(&self, n: usize) -> String {
        let one = format!("(?, ?, ?, ?, ?, {NOW_MS}, {NOW_MS} + ?, 0, 'pending')");
        format!(
            "INSERT IGNORE INTO {} (destination, message_id, headers, payload, ordering_key, \
             written_at, due_at, attempts, state) VALUES {}",
            self.table,
            vec![one; n].join(", ")
        )
    }

    /// Put `n` taken rows under the hold. Parameters: token, held until, the ids.
    pub(crate) fn hold(&self, n: usize) -> String {
        format!(
            "UPDATE {} SET state = 'held', holder = ?, held_until = ?, attempts = attempts + 1 \
             WHERE id IN ({})",
            self.table,
            marks(n)
        )
    }

    /// Lock the rows of `n` ids still held. Parameters: now, the ids, token, now.
    pub(crate) fn held(&self, n: usize) -> String {
        format!(
            "SELECT {NOW_MS} AS now_ms, id FROM {} WHERE id IN ({}) AND {} FOR UPDATE",
            self.table,
            marks(n),
            held_by()
        )
    }

    /// Mark `n` locked held rows sent. Parameters: now, the ids.
    pub(crate) fn mark_sent(&self, n: usize) -> String {
        format!(
            "UPDATE {} SET state = 'sent', sent_at = ?, holder = NULL, held_until = NULL \
             WHERE id IN ({})",
            self.table,
            marks(n)
        )
    }

    /// Hand `n` held rows back. Parameters: now, the ids, token, now.
    pub(crate) fn hand_back(&self, n: usize) -> String {
        format!(
            "UPDATE {} SET state = 'pending', holder = NULL, held_until = NULL, \
               due_at = {NOW_MS}, attempts = GREATEST(attempts - 1, 0) \
             WHERE id IN ({}) AND {}",
            self.table,
            marks(n),
            held_by()
        )
    }
}

/// The outbox statements whose parameters are the same on every server (see
/// [`SharedStatements`]), for the outbox table `table` (quoted).
pub(crate) fn shared(table: &str) -> SharedStatements {
    SharedStatements {
        retry: sql(format!(
            "UPDATE {table} SET state = 'pending', due_at = {NOW_MS}, attempts = 0 \
             WHERE id = ? AND state IN ('dead', 'pending')"
        )),
        stats: sql(format!(
            "SELECT {NOW_MS} AS now_ms, s.state, s.n, s.oldest \
             FROM (SELECT 1 AS one) o LEFT JOIN ( \
               SELECT state, COUNT(*) AS n, MIN(written_at) AS oldest \
               FROM {table} GROUP BY state) s ON TRUE"
        )),
        // One pass over the table, as `stats` (no index serves a grouping by
        // destination; one would cost every enqueue and state change).
        stats_by_destination: sql(format!(
            "SELECT {NOW_MS} AS now_ms, s.destination, s.state, s.n, s.oldest \
             FROM (SELECT 1 AS one) o LEFT JOIN ( \
               SELECT destination, state, COUNT(*) AS n, MIN(written_at) AS oldest \
               FROM {table} GROUP BY destination, state) s ON TRUE"
        )),
        purge_batch: sql(format!(
            "DELETE FROM {table} WHERE state = 'sent' AND sent_at <= {NOW_MS} - ? \
             ORDER BY sent_at LIMIT ?"
        )),
    }
}
