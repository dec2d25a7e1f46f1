//! The outbox's statements, rendered once for its table (`{table}`, a validated name).
//!
//! Every statement that needs "now" takes it as a parameter: the store's clock, read by
//! the caller inside the write transaction.

/// The columns [`crate::outbox`] decodes, in order.
const ROW: &str = "id, destination, message_id, headers, payload, ordering_key, written_at, \
     attempts, state, due_at, sent_at, last_error";

/// Enqueue one message (?1 destination, ?2 message id, ?3 headers JSON, ?4 payload, ?5
/// ordering key, ?6 now, ?7 due at); a message id already present writes nothing.
const ENQUEUE: &str = "INSERT INTO \"{table}\" \
     (destination, message_id, headers, payload, ordering_key, written_at, due_at, attempts, state) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, 'pending') \
     ON CONFLICT (message_id) DO NOTHING";

/// Take at most ?4 due rows at now ?1 for holder ?2 until ?3: due pending rows and held
/// rows whose hold ran out, skipping a row while an earlier row of its ordering key is
/// pending or held (so at most one row per key), by due time then id. SQLite has one
/// writer: the write transaction around it is the only lock needed.
const TAKE: &str = "UPDATE \"{table}\" \
     SET state = 'held', holder = ?2, held_until = ?3, attempts = attempts + 1 \
     WHERE id IN ( \
         SELECT c.id FROM \"{table}\" c \
         WHERE ((c.state = 'pending' AND c.due_at <= ?1) \
                OR (c.state = 'held' AND c.held_until <= ?1)) \
           AND (c.ordering_key IS NULL OR NOT EXISTS ( \
                SELECT 1 FROM \"{table}\" e \
                WHERE e.ordering_key = c.ordering_key AND e.id < c.id \
                  AND e.state IN ('pending', 'held'))) \
         ORDER BY c.due_at, c.id LIMIT ?4) \
     RETURNING {row}";

/// The fence of every mark: ?1 now, ?2 the holder's token, the row still held by it.
const HELD_BY: &str = "state = 'held' AND holder = ?2 AND held_until > ?1";

/// Mark row ?3 sent at ?1 where ?2 holds it.
const MARK_SENT: &str = "UPDATE \"{table}\" \
     SET state = 'sent', sent_at = ?1, holder = NULL, held_until = NULL \
     WHERE id = ?3 AND {held_by}";

/// Record a failed publish of row ?3 where ?2 holds it at ?1: error ?4; dead when ?5, else
/// pending again, due at ?6.
const MARK_FAILED: &str = "UPDATE \"{table}\" \
     SET holder = NULL, held_until = NULL, last_error = ?4, \
         state = CASE WHEN ?5 THEN 'dead' ELSE 'pending' END, \
         due_at = CASE WHEN ?5 THEN due_at ELSE ?6 END \
     WHERE id = ?3 AND {held_by}";

/// Hand row ?3 back where ?2 holds it at ?1: pending, due now, the attempt not counted.
const HAND_BACK: &str = "UPDATE \"{table}\" \
     SET state = 'pending', holder = NULL, held_until = NULL, due_at = ?1, \
         attempts = max(attempts - 1, 0) \
     WHERE id = ?3 AND {held_by}";

/// An operator's retry of row ?2 at ?1: a dead or pending row becomes pending, due now,
/// with no attempts.
const RETRY: &str = "UPDATE \"{table}\" SET state = 'pending', due_at = ?1, attempts = 0 \
     WHERE id = ?2 AND state IN ('dead', 'pending')";

/// Rows per state, with the oldest write among the unsent ones.
const STATS: &str = "SELECT state, count(*), min(written_at) FROM \"{table}\" GROUP BY state";

/// [`STATS`] per destination: one pass over the table (no index serves the grouping; one
/// would cost every enqueue and state change to speed up an operator's read).
const STATS_BY_DESTINATION: &str = "SELECT state, count(*), min(written_at), destination \
     FROM \"{table}\" GROUP BY destination, state";

/// An operator's listing: ?1 state or NULL, ?2 destination or NULL, ids after ?3, at most ?4.
const LIST: &str = "SELECT {row} FROM \"{table}\" \
     WHERE id > ?3 AND (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR destination = ?2) \
     ORDER BY id LIMIT ?4";

/// One purge batch: at most ?2 rows sent at or before ?1, oldest first.
const PURGE_BATCH: &str = "DELETE FROM \"{table}\" WHERE id IN ( \
     SELECT id FROM \"{table}\" WHERE state = 'sent' AND sent_at <= ?1 \
     ORDER BY sent_at LIMIT ?2)";

/// The outbox statements of one store.
#[derive(Debug)]
pub(crate) struct OutboxStatements {
    pub(crate) enqueue: String,
    pub(crate) take: String,
    pub(crate) mark_sent: String,
    pub(crate) mark_failed: String,
    pub(crate) hand_back: String,
    pub(crate) retry: String,
    pub(crate) stats: String,
    pub(crate) stats_by_destination: String,
    pub(crate) list: String,
    pub(crate) purge_batch: String,
}

impl OutboxStatements {
    /// The statements for the outbox table `table`.
    pub(crate) fn new(table: &str) -> Self {
        let render = |template: &str| {
            template
                .replace("{held_by}", HELD_BY)
                .replace("{row}", ROW)
                .replace("{table}", table)
        };
        OutboxStatements {
            enqueue: render(ENQUEUE),
            take: render(TAKE),
            mark_sent: render(MARK_SENT),
            mark_failed: render(MARK_FAILED),
            hand_back: render(HAND_BACK),
            retry: render(RETRY),
            stats: render(STATS),
            stats_by_destination: render(STATS_BY_DESTINATION),
            list: render(LIST),
            purge_batch: render(PURGE_BATCH),
        }
    }
}
