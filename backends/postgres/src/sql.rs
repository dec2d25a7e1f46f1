//! Every statement the store runs, built once per store for its `<schema>.<table>`.
//!
//! Identifiers cannot be bound as parameters, so the (validated, quoted) table name is
//! spliced into the text here; every value is a bind parameter. Each statement that reads
//! the clock takes it as `$1`: the injected clock's milliseconds, or NULL for the server's
//! own clock (`clock_timestamp()`, not `now()`, which inside a caller's long transaction is
//! the transaction's start).
//!
//! The row-returning statements (claims and commits) all return the same columns, decoded
//! by [`crate::record`]: `wrote` (this statement changed the row), `now_ms` (the statement's
//! "now"), the key, then the record. When a statement did not write, the row it returns is
//! the key's record as of the statement's snapshot.

use sqlx::{AssertSqlSafe, SqlStr};

/// "Now" in milliseconds for every statement: the bound clock, else the server's clock.
const NOW_CTE: &str = "now AS (SELECT coalesce($1::bigint, \
     floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) AS ms)";

/// The record's columns after the key, in the order [`crate::record`] decodes them.
fn record_cols(alias: &str) -> String {
    [
        "token::text",
        "fence",
        "attempt",
        "expires_at",
        "processed_at",
        "outcome",
        "fingerprint",
    ]
    .iter()
    .map(|c| {
        let name = c.trim_end_matches("::text");
        format!("{alias}{c} AS {name}")
    })
    .collect::<Vec<_>>()
    .join(", ")
}

/// The key and record columns, qualified by `alias` (`""` or `"r."`).
fn row_cols(alias: &str) -> String {
    format!(
        "{alias}consumer AS consumer, {alias}message_id AS message_id, {}",
        record_cols(alias)
    )
}

/// When an existing row may be taken over by a claim (`r` the stored row, `excluded` the
/// proposed one): in flight, lease expired by "now", and no fingerprint mismatch. Anything
/// else leaves the row alone and the statement reports the stored record instead.
const TAKEOVER_WHERE: &str = "r.processed_at IS NULL \
     AND r.expires_at <= (SELECT ms FROM now) \
     AND (excluded.fingerprint IS NULL OR r.fingerprint IS NULL \
          OR r.fingerprint = excluded.fingerprint)";

/// The statements of one store.
#[derive(Debug)]
pub(crate) struct Statements {
    /// Lease-mode claim of one key.
    pub(crate) claim: SqlStr,
    /// Lease-mode claim of many distinct keys (parallel arrays).
    pub(crate) claim_many: SqlStr,
    /// Claim inside the caller's transaction: a completed row.
    pub(crate) claim_in_tx: SqlStr,
    /// Commit of one lease.
    pub(crate) commit: SqlStr,
    /// Commit of many leases on distinct keys (parallel arrays).
    pub(crate) commit_many: SqlStr,
    /// Renew a lease.
    pub(crate) renew: SqlStr,
    /// Release a lease.
    pub(crate) release: SqlStr,
    /// Read one record.
    pub(crate) get: SqlStr,
    /// Delete one batch of purgeable records.
    pub(crate) purge_batch: SqlStr,
}

fn sql(text: String) -> SqlStr {
    // Safe: the only spliced text is the table name, validated by
    // `dedup_core::names::sql_identifier` (ASCII letters, digits, '_') and quoted.
    sqlx::SqlSafeStr::into_sql_str(AssertSqlSafe(std::sync::Arc::<str>::from(text)))
}

impl Statements {
    /// The statements for `table`, already quoted and schema-qualified (`"s"."t"`).
    pub(crate) fn new(table: &str) -> Self {
        let cols = row_cols("");
        let r_cols = row_cols("r.");
        let t_cols = row_cols("t.");
        // The tail of every claim / commit: the rows the `cte` wrote, then the stored rows
        // (`read`: a select list and FROM clause).
        let union = |cte: &str, read: &str| {
            format!(
                "SELECT true AS wrote, (SELECT ms FROM now) AS now_ms, {cte}.* FROM {cte} \
                 UNION ALL \
                 SELECT false, (SELECT ms FROM now), {read}"
            )
        };
        let one_key =
            format!("{t_cols} FROM {table} t WHERE t.consumer = $2 AND t.message_id = $3");
        // Batches read each requested key's row by its primary key, one lookup per key: a
        // LATERAL subquery with LIMIT cannot be flattened into a join, so the planner cannot
        // pick a scan of the consumer's rows, which stale statistics (a new consumer, a
        // backfill) make look cheap and which made plain joins against unnest quadratic
        // (DESIGN.md).
        let lookup = |cols: &str| {
            format!(
                "req q CROSS JOIN LATERAL (SELECT {cols} FROM {table} t \
                 WHERE t.consumer = q.consumer AND t.message_id = q.message_id LIMIT 1) x"
            )
        };

        let claim = format!(
            "WITH {NOW_CTE}, ins AS ( \
               INSERT INTO {table} AS r (consumer, message_id, token, fence, attempt, expires_at, fingerprint) \
               SELECT $2, $3, $4::uuid, 1, 1, now.ms + $5::bigint, $6::text FROM now \
               ON CONFLICT (consumer, message_id) DO UPDATE SET \
                 token = excluded.token, fence = r.fence + 1, attempt = r.attempt + 1, \
                 expires_at = excluded.expires_at, \
                 fingerprint = coalesce(excluded.fingerprint, r.fingerprint) \
               WHERE {TAKEOVER_WHERE} \
               RETURNING {r_cols}) {}",
            union("ins", &one_key)
        );

        // Rows are inserted in array order, which the caller sorts by key (byte order, the
        // same as COLLATE "C"): concurrent batches lock shared keys in one order and cannot
        // deadlock each other.
        let claim_many = format!(
            "WITH {NOW_CTE}, \
             req AS (SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[]) \
                     WITH ORDINALITY AS q(consumer, message_id, token, lease_ms, fingerprint, ord)), \
             ins AS ( \
               INSERT INTO {table} AS r (consumer, message_id, token, fence, attempt, expires_at, fingerprint) \
               SELECT q.consumer, q.message_id, q.token::uuid, 1, 1, (SELECT ms FROM now) + q.lease_ms, q.fingerprint \
               FROM req q ORDER BY q.ord \
               ON CONFLICT (consumer, message_id) DO UPDATE SET \
                 token = excluded.token, fence = r.fence + 1, attempt = r.attempt + 1, \
                 expires_at = excluded.expires_at, \
                 fingerprint = coalesce(excluded.fingerprint, r.fingerprint) \
               WHERE {TAKEOVER_WHERE} \
               RETURNING {r_cols}) {}",
            union("ins", &format!("x.* FROM {}", lookup(&t_cols)))
        );

        // A completed row (no token, no lease, no outcome). An expired lease-mode record is
        // taken over the same way as in lease mode, and becomes completed.
        let claim_in_tx = format!(
            "WITH {NOW_CTE}, ins AS ( \
               INSERT INTO {table} AS r (consumer, message_id, token, fence, attempt, processed_at, fingerprint) \
               SELECT $2, $3, NULL, 1, 1, now.ms, $4::text FROM now \
               ON CONFLICT (consumer, message_id) DO UPDATE SET \
                 token = NULL, fence = r.fence + 1, attempt = r.attempt + 1, expires_at = NULL, \
                 processed_at = excluded.processed_at, outcome = NULL, \
                 fingerprint = coalesce(excluded.fingerprint, r.fingerprint) \
               WHERE {TAKEOVER_WHERE} \
               RETURNING {r_cols}) {}",
            union("ins", &one_key)
        );

        let commit = format!(
            "WITH {NOW_CTE}, upd AS ( \
               UPDATE {table} SET processed_at = (SELECT ms FROM now), expires_at = NULL, outcome = $5::bytea \
               WHERE consumer = $2 AND message_id = $3 AND token = $4::uuid AND processed_at IS NULL \
               RETURNING {cols}) {}",
            union("upd", &one_key)
        );

        // `cur` reads every requested key's row (with its ctid) for the answer; `held` locks,
        // in key order (see claim_many), those still held by the request's token, one TID
        // lookup each; the update completes exactly those, again by ctid. A row changed
        // since the snapshot fails the ctid check when `held` rechecks it, so it is left
        // alone and reported from the snapshot, which the caller recognises as stale and
        // runs again.
        let commit_many = format!(
            "WITH {NOW_CTE}, \
             req AS (SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::bytea[]) \
                     WITH ORDINALITY AS q(consumer, message_id, req_token, req_outcome, ord)), \
             cur AS (SELECT q.req_token, q.req_outcome, x.* FROM {}), \
             held AS (SELECT c.row_id, c.req_outcome FROM cur c CROSS JOIN LATERAL ( \
                        SELECT 1 FROM {table} t WHERE t.ctid = c.row_id \
                          AND t.token = c.req_token::uuid AND t.processed_at IS NULL \
                        FOR UPDATE) l), \
             upd AS ( \
               UPDATE {table} r SET processed_at = (SELECT ms FROM now), expires_at = NULL, \
                 outcome = h.req_outcome \
               FROM held h \
               WHERE r.ctid = h.row_id AND r.ctid = ANY(ARRAY(SELECT row_id FROM held)) \
               RETURNING {r_cols}) {}",
            lookup(&format!("t.ctid AS row_id, {t_cols}")),
            union("upd", &format!("{cols} FROM cur"))
        );

        let renew = format!(
            "WITH {NOW_CTE} \
             UPDATE {table} SET expires_at = (SELECT ms FROM now) + $5::bigint \
             WHERE consumer = $2 AND message_id = $3 AND token = $4::uuid AND processed_at IS NULL \
             RETURNING fence, attempt, expires_at"
        );

        let release = format!(
            "WITH {NOW_CTE} \
             UPDATE {table} SET expires_at = least(expires_at, (SELECT ms FROM now)) \
             WHERE consumer = $2 AND message_id = $3 AND token = $4::uuid AND processed_at IS NULL \
             RETURNING fence"
        );

        let get = format!("SELECT {cols} FROM {table} WHERE consumer = $1 AND message_id = $2");

        // One bounded batch: the oldest completed rows by the completed index, then (to fill
        // the batch) the longest-expired leases by the in-flight index, each from its keyset
        // position (`$4`, `$5`: the largest processed_at / expires_at the previous batch
        // removed), so a long purge never rescans the index entries of the rows it already
        // deleted. SKIP LOCKED passes over rows a claim or another purger holds, so purgers
        // on many nodes split the work and never wait; the delete reaches the locked rows by
        // ctid.
        let purge_batch = format!(
            "WITH {NOW_CTE}, \
             done AS (SELECT ctid AS row_id FROM {table} \
                      WHERE processed_at < (SELECT ms FROM now) - $2::bigint \
                        AND processed_at >= $4::bigint \
                      ORDER BY processed_at LIMIT $3::bigint FOR UPDATE SKIP LOCKED), \
             stale AS (SELECT ctid AS row_id FROM {table} \
                       WHERE processed_at IS NULL AND expires_at < (SELECT ms FROM now) - $2::bigint \
                         AND expires_at >= $5::bigint \
                       ORDER BY expires_at LIMIT ($3::bigint - (SELECT count(*) FROM done)) \
                       FOR UPDATE SKIP LOCKED) \
             DELETE FROM {table} t USING (SELECT row_id FROM done UNION ALL SELECT row_id FROM stale) d \
             WHERE t.ctid = d.row_id \
             RETURNING t.processed_at, t.expires_at"
        );

        Statements {
            claim: sql(claim),
            claim_many: sql(claim_many),
            claim_in_tx: sql(claim_in_tx),
            commit: sql(commit),
            commit_many: sql(commit_many),
            renew: sql(renew),
            release: sql(release),
            get: sql(get),
            purge_batch: sql(purge_batch),
        }
    }
}
