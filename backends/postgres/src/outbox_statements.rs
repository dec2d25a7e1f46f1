//! The outbox's statements, rendered once for its `"schema"."table"`.
//!
//! As for the records (see [`crate::statements`]): the validated, quoted table name is
//! spliced in, every value is a bind parameter, and each statement that reads the clock
//! takes it as `$1` ([`NOW_MS`]: the injected clock, or the server's).

use dedup_sql::outbox::SharedStatements;
use sqlx::SqlStr;

use crate::statements::{ASYNC_COMMIT_CTE, NOW_MS, sql};

/// The outbox row columns the dialect decodes, qualified by `alias`.
fn row(alias: &str) -> String {
    dedup_sql::outbox::ROW_COLUMNS
        .iter()
        .map(|c| match *c {
            "headers" => format!("{alias}headers::text AS headers"),
            _ => format!("{alias}{c} AS {c}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The outbox statements of one store.
#[derive(Debug)]
pub(crate) struct OutboxStatements {
    /// Lock the ordering keys' advisory locks ($1 keys, sorted) for the transaction.
    pub(crate) lock_keys: SqlStr,
    /// Insert messages (parallel arrays), notify once when any row was new.
    pub(crate) enqueue: SqlStr,
    /// The trailing notification of producers whose own was skipped: which of their
    /// transactions are still open, and a `NOTIFY` when any committed.
    pub(crate) trailing: SqlStr,
    /// Take due rows under a fresh hold.
    pub(crate) take: SqlStr,
    /// Mark held rows sent.
    pub(crate) mark_sent: SqlStr,
    /// Record a failed publish.
    pub(crate) mark_failed: SqlStr,
    /// Hand held rows back.
    pub(crate) hand_back: SqlStr,
    /// An operator's listing.
    pub(crate) list: SqlStr,
}

impl OutboxStatements {
    /// The statements for the outbox table `table` (`"schema"."table"`, quoted).
    pub(crate) fn new(table: &str) -> Self {
        let now = format!("(SELECT {NOW_MS} AS ms) now");
        // The fence of every mark: $2 the hold's token, the row still held by it at now.
        let held_by = "t.state = 'held' AND t.holder = $2::uuid AND t.held_until > now.ms";
        // No earlier row of the same ordering key is pending or held.
        let in_order = format!(
            "(c.ordering_key IS NULL OR NOT EXISTS ( \
               SELECT 1 FROM {table} e \
               WHERE e.ordering_key = c.ordering_key AND e.id < c.id \
                 AND e.state IN ('pending', 'held')))"
        );
        let due = "((c.state = 'pending' AND c.due_at <= (SELECT ms FROM now)) \
                   OR (c.state = 'held' AND c.held_until <= (SELECT ms FROM now)))";
        OutboxStatements {
            // Function scans return rows in array order: the locks are taken in the sorted
            // order the caller gives, so two producers never wait for each other in a cycle.
            lock_keys: sql(
                "SELECT pg_advisory_xact_lock(k) FROM unnest($1::bigint[]) AS u(k)".to_owned(),
            ),
            // $2..$7 the messages' columns (delays in ms), $8 the channel (NULL: no notify). Inserted in the
            // caller's order, so ids follow it. When rows were new but the notification
            // was skipped, `xact` is the transaction's id, for its trailing notification.
            // $9 the transactions skipped before, when this one notifies: those that
            // committed are covered by its notification (delivered at its commit, after
            // this statement saw them committed); `still_open` are the others.
            enqueue: sql(format!(
                "WITH now AS (SELECT {NOW_MS} AS ms), \
                 ins AS ( \
                   INSERT INTO {table} (destination, message_id, headers, payload, \
                                        ordering_key, written_at, due_at, attempts, state) \
                   SELECT m.destination, m.message_id, m.headers::jsonb, m.payload, \
                          m.ordering_key, now.ms, now.ms + m.delay_ms, 0, 'pending' \
                   FROM unnest($2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[], \
                               $7::bigint[]) WITH ORDINALITY \
                        AS m(destination, message_id, headers, payload, ordering_key, \
                             delay_ms, n), now \
                   ORDER BY m.n \
                   ON CONFLICT (message_id) DO NOTHING \
                   RETURNING 1), \
                 written AS (SELECT count(*) AS n FROM ins) \
                 SELECT n AS written, \
                        CASE WHEN n > 0 AND $8::text IS NOT NULL THEN pg_notify($8, '')::text END AS notified, \
                        CASE WHEN n > 0 AND $8::text IS NULL THEN txid_current() END AS xact, \
                        (SELECT coalesce(array_agg(x), '{{}}'::bigint[]) \
                         FROM unnest($9::bigint[]) AS u(x) \
                         WHERE txid_status(x) = 'in progress') AS still_open \
                 FROM written"
            )),
            // $1 the channel, $2 the skipped transactions' ids. Its own transaction (the
            // pool's autocommit) delivers the notification as soon as it returns.
            trailing: sql(
                "WITH x AS (SELECT id, txid_status(id) AS status FROM unnest($2::bigint[]) AS u(id)) \
                 SELECT coalesce((SELECT array_agg(id) FROM x WHERE status = 'in progress'), \
                                 '{}'::bigint[]) AS open, \
                        CASE WHEN EXISTS (SELECT 1 FROM x WHERE status = 'committed') \
                             THEN pg_notify($1, '')::text END AS notified"
                    .to_owned(),
            ),
            // $2 token, $3 limit, $4 hold in ms. Due pending rows and held rows whose hold
            // ran out, not while an earlier row of their key is pending or held, locked with
            // SKIP LOCKED (a row another take is holding is passed over; its later rows of
            // the same key stay blocked by it, since it is pending or held in every
            // snapshot). One row comes back even when nothing was taken, for "now".
            take: sql(format!(
                "WITH now AS (SELECT {NOW_MS} AS ms), \
                 pending AS ( \
                   SELECT c.id, c.due_at FROM {table} c \
                   WHERE c.state = 'pending' AND c.due_at <= (SELECT ms FROM now) \
                     AND {in_order} \
                   ORDER BY c.due_at, c.id \
                   LIMIT $3 \
                   FOR UPDATE OF c SKIP LOCKED), \
                 expired AS ( \
                   SELECT c.id, c.due_at FROM {table} c \
                   WHERE c.state = 'held' AND c.held_until <= (SELECT ms FROM now) \
                     AND {in_order} \
                   ORDER BY c.due_at, c.id \
                   LIMIT $3 \
                   FOR UPDATE OF c SKIP LOCKED), \
                 picked AS ( \
                   SELECT id FROM (SELECT * FROM pending UNION ALL SELECT * FROM expired) u \
                   ORDER BY due_at, id \
                   LIMIT $3), \
                 taken AS ( \
                   UPDATE {table} c \
                   SET state = 'held', holder = $2::uuid, \
                       held_until = (SELECT ms FROM now) + $4::bigint, \
                       attempts = c.attempts + 1 \
                   FROM picked WHERE c.id = picked.id AND {due} \
                   RETURNING {taken_row}) \
                 SELECT now.ms AS now_ms, taken.* FROM now LEFT JOIN taken ON true",
                taken_row = row("c."),
            )),
            // $3 ids.
            mark_sent: sql(format!(
                "UPDATE {table} t \
                 SET state = 'sent', sent_at = now.ms, holder = NULL, held_until = NULL \
                 FROM {now} WHERE t.id = ANY($3::bigint[]) AND {held_by} \
                 RETURNING t.id"
            )),
            // $3 id, $4 error, $5 dead, $6 delay in ms.
            mark_failed: sql(format!(
                "UPDATE {table} t \
                 SET holder = NULL, held_until = NULL, last_error = $4, \
                     state = CASE WHEN $5::boolean THEN 'dead' ELSE 'pending' END, \
                     due_at = CASE WHEN $5::boolean THEN t.due_at ELSE now.ms + $6::bigint END \
                 FROM {now} WHERE t.id = $3 AND {held_by}"
            )),
            // $3 ids.
            hand_back: sql(format!(
                "UPDATE {table} t \
                 SET state = 'pending', holder = NULL, held_until = NULL, due_at = now.ms, \
                     attempts = greatest(t.attempts - 1, 0) \
                 FROM {now} WHERE t.id = ANY($3::bigint[]) AND {held_by}"
            )),
            // $1 state or NULL, $2 destination or NULL, $3 after id, $4 limit.
            list: sql(format!(
                "SELECT {cols} FROM {table} \
                 WHERE id > $3 AND ($1::text IS NULL OR state = $1) \
                   AND ($2::text IS NULL OR destination = $2) \
                 ORDER BY id LIMIT $4",
                cols = row(""),
            )),
        }
    }
}

/// The outbox statements whose parameters are the same on every server (see
/// [`SharedStatements`]), for the outbox table `table` (`"schema"."table"`, quoted).
pub(crate) fn shared(table: &str) -> SharedStatements {
    let now = format!("(SELECT {NOW_MS} AS ms) now");
    SharedStatements {
        // $2 id.
        retry: sql(format!(
            "UPDATE {table} t SET state = 'pending', due_at = now.ms, attempts = 0 \
             FROM {now} WHERE t.id = $2 AND t.state IN ('dead', 'pending')"
        )),
        stats: sql(format!(
            "SELECT now.ms AS now_ms, s.state, s.n, s.oldest \
             FROM {now} LEFT JOIN ( \
               SELECT state, count(*) AS n, min(written_at) AS oldest \
               FROM {table} GROUP BY state) s ON true"
        )),
        // One pass over the table, as `stats` (no index serves a grouping by
        // destination; one would cost every enqueue and state change).
        stats_by_destination: sql(format!(
            "SELECT now.ms AS now_ms, s.destination, s.state, s.n, s.oldest \
             FROM {now} LEFT JOIN ( \
               SELECT destination, state, count(*) AS n, min(written_at) AS oldest \
               FROM {table} GROUP BY destination, state) s ON true"
        )),
        // $2 retention in ms, $3 limit. Commits without waiting for its log flush (see
        // `ASYNC_COMMIT_CTE`: a lost batch brings back sent rows the next purge removes).
        purge_batch: sql(format!(
            "WITH {ASYNC_COMMIT_CTE} DELETE FROM {table} USING async_commit WHERE id IN ( \
               SELECT id FROM {table} \
               WHERE state = 'sent' AND sent_at <= (SELECT {NOW_MS}) - $2::bigint \
               ORDER BY sent_at LIMIT $3 FOR UPDATE SKIP LOCKED)"
        )),
    }
}
