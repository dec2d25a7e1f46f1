//! Every statement the store runs, built once per store for its `<schema>.<table>`.
//!
//! Identifiers cannot be bound as parameters, so the (validated, quoted) table name is
//! spliced into the text here; every value is a bind parameter. Each statement that reads
//! the clock takes it as `$1`: the injected clock's milliseconds, or NULL for the server's
//! own clock (`clock_timestamp()`, not `now()`, which inside a caller's long transaction is
//! the transaction's start).
//!
//! The row-returning statements (claims, commits and the reads that follow them) all return
//! the same columns, decoded by [`crate::decode`]: `wrote` (this statement changed the row),
//! `now_ms` (the statement's "now"), the key, then the record. A claim or commit returns
//! only the rows it wrote (the usual case: one statement, no second lookup); for the keys it
//! did not write, the store then reads the stored records with [`Statements::read_one`] /
//! [`Statements::read_many`], as of that read's snapshot.

use dedup_sql::migrate::RECORD_COLUMNS;
use sqlx::{AssertSqlSafe, SqlStr};

/// "Now" in milliseconds since the Unix epoch: the bound clock `$1`, else the server's clock.
/// The one definition of "now" for the store's statements and the operator's reads.
///
/// It gives the millisecond the exact numeric computation
/// `floor(extract(epoch FROM clock_timestamp()) * 1000)` gives, but computes with doubles:
/// `date_part` gives the epoch as a double (`extract` gives a numeric, about twice as slow to
/// compute with). Server times are whole microseconds. The double epoch and its product by
/// 1000 are each rounded by at most half a unit in the last place, under 0.125 µs each while
/// the epoch is below 2^31 s (until 2038), so the double is within 0.25 µs of the exact
/// time. A time on a whole millisecond can therefore come out just below it, and a bare
/// `floor` would give the millisecond before: adding half a microsecond (itself rounded by
/// under 0.125 µs) puts every time strictly inside its own millisecond, so `floor` gives the
/// exact one. The test below checks both agree over 1.4 million times, today and in 2100.
pub(crate) const NOW_MS: &str =
    "coalesce($1::bigint, floor(date_part('epoch', clock_timestamp()) * 1000 + 0.0005)::bigint)";

/// "Now" as a one-row relation `now(ms)`, for a FROM clause (cheaper than a CTE).
fn now_row() -> String {
    format!("(SELECT {NOW_MS} AS ms) now")
}

/// "Now" as a CTE `now(ms)`, for statements with CTEs of their own.
fn now_cte() -> String {
    format!("now AS (SELECT {NOW_MS} AS ms)")
}

/// A CTE `async_commit` that makes the statement's own transaction commit without waiting
/// for its log flush (`synchronous_commit = off` for that transaction only: `set_config`
/// with `is_local`, undone when it ends). A statement joins it (a one-row relation) so the
/// server evaluates it whenever the statement writes anything.
///
/// Only for writes whose loss in a crash harms nothing: the purges and the purge run's row.
/// A purge batch lost with the last fraction of a second of log brings back records that
/// were already past retention, so the next purge removes them again; a deduplication that
/// lasts longer than asked never runs a handler twice. Any later synchronous commit (every
/// claim and commit, on the same log) makes the lost-able batch durable too. What it buys:
/// under durable settings a batch otherwise waits for its own `fdatasync`, which makes
/// the paced purge's batches look slow to the pacing, shrinks them to the smallest size and
/// lengthens the rests; the purge then crawls (about 1 600 rows/s under a claim stream).
pub(crate) const ASYNC_COMMIT_CTE: &str =
    "async_commit AS (SELECT set_config('synchronous_commit', 'off', true) AS setting)";

/// The record's columns after the key, in the order [`crate::decode`] decodes them: those
/// every layout has had ([`RECORD_COLUMNS`], the token as text), then the later ones, the
/// first claim as [`first_claim`] reads it.
fn record_cols(alias: &str) -> String {
    RECORD_COLUMNS[2..]
        .iter()
        .chain(&["first_claimed_at", "last_failure"])
        .map(|c| match *c {
            "token" => format!("{alias}token::text AS token"),
            "first_claimed_at" => format!("{} AS first_claimed_at", first_claim(alias)),
            _ => format!("{alias}{c} AS {c}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// When the key of the row `alias` was first claimed, in ms (NULL: not known). A claim
/// that inserts leaves `first_claimed_at` NULL (8 bytes less on every record): a key
/// claimed once, fence 1, was first claimed at `claimed_at`. A takeover writes the first
/// claim into `first_claimed_at` as it moves `claimed_at` on. NULL with a fence above 1 is
/// not known: a row written before the column (version 3), or a key claimed once by this
/// version and then taken over by a process of the previous one, which did not carry the
/// first claim over. (Rows older than version 2 show the `claimed_at` that migration
/// filled in: their expiry or processing time.)
pub(crate) fn first_claim(alias: &str) -> String {
    format!(
        "coalesce({alias}first_claimed_at, CASE WHEN {alias}fence = 1 THEN {alias}claimed_at END)"
    )
}

/// The key and record columns, qualified by `alias` (`""` or `"r."`), named as
/// [`crate::decode`] reads them.
pub(crate) fn row_cols(alias: &str) -> String {
    format!(
        "{alias}consumer AS consumer, {alias}message_id AS message_id, {}",
        record_cols(alias)
    )
}

/// When an existing row may be taken over by a claim (`r` the stored row, `excluded` the
/// proposed one, whose `claimed_at` is "now"): in flight, lease expired by "now", and no
/// fingerprint mismatch. Anything else leaves the row alone (the statement returns nothing
/// for it, and the store reads the stored record).
const TAKEOVER_WHERE: &str = "r.processed_at IS NULL \
     AND r.expires_at <= excluded.claimed_at \
     AND (excluded.fingerprint IS NULL OR r.fingerprint IS NULL \
          OR r.fingerprint = excluded.fingerprint)";

/// A purge's cutoff: "now" (the `now` relation) less the retention in milliseconds, `$2`
/// (bound as [`retention_ms`](dedup_sql::purge::retention_ms)).
const PURGE_CUTOFF: &str = "(SELECT ms FROM now) - $2::bigint";

/// Which records are purgeable at [`PURGE_CUTOFF`]: completed before it, or in flight with a
/// lease that expired before it. `claimed_at` comes first, for its index: a record is
/// claimed before it is completed or its lease expires (claimed_at <= processed_at,
/// claimed_at <= expires_at), so every purgeable record has claimed_at before the cutoff.
/// One text for the purge batch and for counting what a purge would remove.
fn purgeable() -> String {
    purgeable_at(PURGE_CUTOFF)
}

/// [`purgeable`]'s condition at `cutoff` (an SQL expression in ms): also the partitioned
/// layout's, whose retirement removes exactly these rows of a partition.
pub(crate) fn purgeable_at(cutoff: &str) -> String {
    format!(
        "claimed_at < {cutoff} \
         AND (processed_at < {cutoff} \
              OR (processed_at IS NULL AND expires_at < {cutoff}))"
    )
}

/// PostgreSQL's SQL for `dedup-sql`'s admin conditions and kept counts.
pub(crate) struct AdminSql;

impl dedup_sql::admin::AdminDialect for AdminSql {
    fn outcome_starts_with(hex: &str) -> String {
        format!(
            "substring(outcome FROM 1 FOR {}) = '\\x{hex}'::bytea",
            hex.len() / 2
        )
    }

    fn count_where(condition: &str) -> String {
        format!("count(*) FILTER (WHERE {condition})")
    }
}

impl dedup_sql::counts::CountsDialect for AdminSql {
    fn bigint(expr: &str) -> String {
        format!("CAST({expr} AS bigint)")
    }

    fn byte_order(column: &str) -> String {
        format!("{column} COLLATE \"C\"")
    }
}

/// A condition that is always true and sets `synchronous_commit` to `off` for the
/// statement's own (implicit) transaction, as `SET LOCAL` would, in the same round trip:
/// the commit then returns without waiting for its log record to reach the disk. The
/// function is volatile, so the planner neither folds nor drops it: it runs for each row of
/// the statement's source (once for a single claim), before anything is written. The
/// setting ends with the transaction.
pub(crate) const LAZY_COMMIT: &str = "set_config('synchronous_commit', 'off', true) = 'off'";

/// The statements of one store.
#[derive(Debug)]
pub(crate) struct Statements {
    /// Lease-mode claim of one key.
    pub(crate) claim: SqlStr,
    /// Lease-mode claim of one key that has no record: a plain insert, returning only the
    /// new lease's expiry; nothing when the key has a record (see
    /// [`Statements::new`]).
    pub(crate) claim_fresh: SqlStr,
    /// [`claim_fresh`](Self::claim_fresh) committed asynchronously (see [`LAZY_COMMIT`]).
    pub(crate) claim_fresh_lazy: SqlStr,
    /// Lease-mode claim of many distinct keys (parallel arrays).
    pub(crate) claim_many: SqlStr,
    /// [`claim`](Self::claim) committed asynchronously (see [`LAZY_COMMIT`]).
    pub(crate) claim_lazy: SqlStr,
    /// [`claim_many`](Self::claim_many) committed asynchronously (see [`LAZY_COMMIT`]).
    pub(crate) claim_many_lazy: SqlStr,
    /// Claim inside the caller's transaction: a completed row.
    pub(crate) claim_in_tx: SqlStr,
    /// Commit of one lease.
    pub(crate) commit: SqlStr,
    /// Commit of one lease still held by its token, returning nothing: the count of rows
    /// it changed says whether it was.
    pub(crate) commit_held: SqlStr,
    /// The partitioned layout's [`commit_held`](Self::commit_held) limited to one
    /// partition, by slot: the slot is a literal, so the planner reads and locks that
    /// partition alone. Empty for the plain layout.
    pub(crate) commit_held_in: Vec<SqlStr>,
    /// Commit of many leases on distinct keys (parallel arrays).
    pub(crate) commit_many: SqlStr,
    /// The partitioned layout's [`commit_many`](Self::commit_many) limited to one
    /// partition, by slot, as [`commit_held_in`](Self::commit_held_in). Empty for the
    /// plain layout.
    pub(crate) commit_many_in: Vec<SqlStr>,
    /// Renew a lease.
    pub(crate) renew: SqlStr,
    /// Release a lease.
    pub(crate) release: SqlStr,
    /// Release a lease keeping a failure (`$5`) on the record.
    pub(crate) release_failed: SqlStr,
    /// Read one record.
    pub(crate) get: SqlStr,
    /// Read one key's record after a claim / commit that did not write it.
    pub(crate) read_one: SqlStr,
    /// Read many keys' records after a batch that did not write them all.
    pub(crate) read_many: SqlStr,
    /// Delete one batch of purgeable records.
    pub(crate) purge_batch: SqlStr,
    /// Count the records a purge would remove now, completed and expired.
    pub(crate) count_purgeable: SqlStr,
    /// An operator's forget: delete one record unless it holds a live lease (or forced).
    pub(crate) forget: SqlStr,
    /// An operator's release: expire a lease and replace its token, if still held.
    pub(crate) revoke: SqlStr,
}

pub(crate) fn sql(text: String) -> SqlStr {
    // Safe: the only spliced text is the table name, validated by
    // `dedup_core::backend::names::sql_identifier` (ASCII letters, digits, '_') and quoted.
    sqlx::SqlSafeStr::into_sql_str(AssertSqlSafe(std::sync::Arc::<str>::from(text)))
}

impl Statements {
    /// The statements for `table`, already quoted and schema-qualified (`"s"."t"`).
    pub(crate) fn new(table: &str) -> Self {
        let cols = row_cols("");
        let r_cols = row_cols("r.");
        let t_cols = row_cols("t.");
        let now_row = now_row();
        let now_cte = now_cte();
        // What a takeover writes into `first_claimed_at` (see `first_claim`): the stored
        // row's first claim, NULL when not known.
        let first_claim = first_claim("r.");
        // The rows a statement wrote, with "now".
        let wrote = |now_ms: &str, cols: &str| {
            format!("RETURNING true AS wrote, {now_ms} AS now_ms, {cols}")
        };
        // Batches read each requested key's row by its primary key, one lookup per key: a
        // LATERAL subquery with LIMIT cannot be flattened into a join, so the planner cannot
        // pick a scan of the consumer's rows, which stale statistics (a new consumer, a
        // backfill) make look cheap and which made plain joins against unnest quadratic
        // (measured: ~48 ms instead of ~1 ms per 100-key batch on a consumer growing from zero).
        let lookup = |cols: &str| {
            format!(
                "req q CROSS JOIN LATERAL (SELECT {cols} FROM {table} t \
                 WHERE t.consumer = q.consumer AND t.message_id = q.message_id LIMIT 1) x"
            )
        };

        let claim = format!(
            "INSERT INTO {table} AS r (consumer, message_id, token, fence, attempt, claimed_at, expires_at, fingerprint) \
               SELECT $2, $3, $4::uuid, 1, 1, now.ms, now.ms + $5::bigint, $6::text FROM {now_row} {{lazy}}\
               ON CONFLICT (consumer, message_id) DO UPDATE SET \
                 token = excluded.token, fence = r.fence + 1, attempt = r.attempt + 1, \
                 first_claimed_at = {first_claim}, claimed_at = excluded.claimed_at, expires_at = excluded.expires_at, \
                 fingerprint = coalesce(excluded.fingerprint, r.fingerprint) \
               WHERE {TAKEOVER_WHERE} {}",
            wrote("r.claimed_at", &r_cols)
        );

        // The common case, a key without a record, as cheap as a claim can be: the insert
        // of a fresh lease that does nothing on a conflict, returning one number. No
        // takeover to plan and evaluate, no record to send back and decode. A key with a
        // record returns no row; the store then reads it and runs `claim` only when the
        // contract says the claim writes (a takeover).
        let claim_fresh = format!(
            "INSERT INTO {table} (consumer, message_id, token, fence, attempt, claimed_at, expires_at, fingerprint) \
               SELECT $2, $3, $4::uuid, 1, 1, now.ms, now.ms + $5::bigint, $6::text FROM {now_row} {{lazy}}\
               ON CONFLICT (consumer, message_id) DO NOTHING RETURNING expires_at"
        );

        // Rows are inserted in array order, which the caller sorts by key (byte order, the
        // same as COLLATE "C"): concurrent batches lock shared keys in one order and cannot
        // deadlock each other.
        let claim_many = format!(
            "WITH {now_cte}, \
             req AS (SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[]) \
                     WITH ORDINALITY AS q(consumer, message_id, token, lease_ms, fingerprint, ord)), \
             ins AS ( \
               INSERT INTO {table} AS r (consumer, message_id, token, fence, attempt, claimed_at, expires_at, fingerprint) \
               SELECT q.consumer, q.message_id, q.token::uuid, 1, 1, now.ms, now.ms + q.lease_ms, q.fingerprint \
               FROM req q CROSS JOIN now {{lazy}}ORDER BY q.ord \
               ON CONFLICT (consumer, message_id) DO UPDATE SET \
                 token = excluded.token, fence = r.fence + 1, attempt = r.attempt + 1, \
                 first_claimed_at = {first_claim}, claimed_at = excluded.claimed_at, expires_at = excluded.expires_at, \
                 fingerprint = coalesce(excluded.fingerprint, r.fingerprint) \
               WHERE {TAKEOVER_WHERE} \
               RETURNING {r_cols}) \
             SELECT true AS wrote, (SELECT ms FROM now) AS now_ms, ins.* FROM ins"
        );

        // A completed row (no token, no lease, no outcome). An expired lease-mode record is
        // taken over the same way as in lease mode, and becomes completed.
        let claim_in_tx = format!(
            "INSERT INTO {table} AS r (consumer, message_id, token, fence, attempt, claimed_at, processed_at, fingerprint) \
               SELECT $2, $3, NULL, 1, 1, now.ms, now.ms, $4::text FROM {now_row} \
               ON CONFLICT (consumer, message_id) DO UPDATE SET \
                 token = NULL, fence = r.fence + 1, attempt = r.attempt + 1, \
                 first_claimed_at = {first_claim}, claimed_at = excluded.claimed_at, expires_at = NULL, \
                 processed_at = excluded.processed_at, outcome = NULL, \
                 fingerprint = coalesce(excluded.fingerprint, r.fingerprint) \
               WHERE {TAKEOVER_WHERE} {}",
            wrote("r.claimed_at", &r_cols)
        );

        let no_outcome = r_cols.replace("r.outcome AS outcome", "NULL::bytea AS outcome");
        // Returns no outcome: the caller knows what it wrote, and a commit's answer never
        // depends on the stored outcome (which can be 64 KiB).
        // The single-key updates use "now" once, so they read the clock in place: no
        // `FROM (SELECT now)` join to plan and run.
        let commit = format!(
            "UPDATE {table} AS r SET processed_at = {NOW_MS}, expires_at = NULL, outcome = $5::bytea \
             WHERE r.consumer = $2 AND r.message_id = $3 AND r.token = $4::uuid \
               AND r.processed_at IS NULL {}",
            wrote("r.processed_at", &no_outcome)
        );

        // The commit by a holder, as the store runs it first: no row comes back, the row
        // count says whether the token still held the lease. Otherwise the store reads the
        // record and decides (a retried commit of the same token is Ok).
        let commit_held = format!(
            "UPDATE {table} AS r SET processed_at = {NOW_MS}, expires_at = NULL, outcome = $5::bytea \
             WHERE r.consumer = $2 AND r.message_id = $3 AND r.token = $4::uuid \
               AND r.processed_at IS NULL"
        );

        // `held` locks, in key order (see claim_many), the rows still held by the request's
        // token, one primary-key lookup each; the update completes exactly those, by ctid.
        // A row changed since the statement's snapshot is left alone (the lock's recheck, or
        // the update's, fails the token / ctid condition); the store then reads it afresh
        // with the keys not written. Like the single commit, returns no outcome.
        let commit_many = format!(
            "WITH {now_cte}, \
             req AS (SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::bytea[]) \
                     WITH ORDINALITY AS q(consumer, message_id, req_token, req_outcome, ord)), \
             held AS (SELECT x.row_id, q.req_outcome FROM req q CROSS JOIN LATERAL ( \
                        SELECT t.ctid AS row_id FROM {table} t \
                        WHERE t.consumer = q.consumer AND t.message_id = q.message_id \
                          AND t.token = q.req_token::uuid AND t.processed_at IS NULL \
                        LIMIT 1 FOR UPDATE) x), \
             upd AS ( \
               UPDATE {table} r SET processed_at = (SELECT ms FROM now), expires_at = NULL, \
                 outcome = h.req_outcome \
               FROM held h \
               WHERE r.ctid = h.row_id AND r.ctid = ANY(ARRAY(SELECT row_id FROM held)) \
               RETURNING {no_outcome}) \
             SELECT true AS wrote, (SELECT ms FROM now) AS now_ms, upd.* FROM upd"
        );

        let read_one = format!(
            "SELECT false AS wrote, now.ms AS now_ms, {t_cols} FROM {now_row} CROSS JOIN {table} t \
             WHERE t.consumer = $2 AND t.message_id = $3"
        );

        let read_many = format!(
            "WITH {now_cte}, \
             req AS (SELECT * FROM unnest($2::text[], $3::text[]) AS q(consumer, message_id)) \
             SELECT false AS wrote, (SELECT ms FROM now) AS now_ms, x.* FROM {}",
            lookup(&t_cols)
        );

        let renew = format!(
            "UPDATE {table} AS r SET expires_at = {NOW_MS} + $5::bigint \
             WHERE r.consumer = $2 AND r.message_id = $3 AND r.token = $4::uuid \
               AND r.processed_at IS NULL \
             RETURNING r.fence, r.attempt, r.expires_at"
        );

        let release = format!(
            "UPDATE {table} AS r SET expires_at = least(r.expires_at, {NOW_MS}) \
             WHERE r.consumer = $2 AND r.message_id = $3 AND r.token = $4::uuid \
               AND r.processed_at IS NULL \
             RETURNING r.fence"
        );

        let release_failed = format!(
            "UPDATE {table} AS r SET expires_at = least(r.expires_at, {NOW_MS}), \
               last_failure = $5::bytea \
             WHERE r.consumer = $2 AND r.message_id = $3 AND r.token = $4::uuid \
               AND r.processed_at IS NULL \
             RETURNING r.fence"
        );

        let get = format!("SELECT {cols} FROM {table} WHERE consumer = $1 AND message_id = $2");

        // One bounded batch, by the claimed_at index (see `purgeable`), walking the records
        // oldest claim first. Records claimed before the cutoff but not purgeable (still
        // held, or completed / expired after the cutoff) are passed over. Each batch starts
        // at the keyset position `$4` (the largest claimed_at the previous batch removed), so
        // a long purge never rescans what it already passed. SKIP LOCKED passes over rows a
        // claim or another purger holds, so purgers on many nodes split the work and never
        // wait; the delete reaches the locked rows by ctid. The batch commits without
        // waiting for its log flush (see `ASYNC_COMMIT_CTE`).
        let purgeable = purgeable();
        let purge_batch = format!(
            "WITH {now_cte}, {ASYNC_COMMIT_CTE}, \
             doomed AS (SELECT ctid AS row_id FROM {table} \
                        WHERE {purgeable} AND claimed_at >= $4::bigint \
                        ORDER BY claimed_at LIMIT $3::bigint FOR UPDATE SKIP LOCKED) \
             DELETE FROM {table} t USING doomed d, async_commit WHERE t.ctid = d.row_id \
             RETURNING t.processed_at, t.claimed_at"
        );

        // What the purge batches would remove, counted at once (the same condition).
        let count_purgeable = format!(
            "WITH {now_cte} \
             SELECT count(*) FILTER (WHERE processed_at IS NOT NULL) AS completed, \
                    count(*) FILTER (WHERE processed_at IS NULL) AS expired \
             FROM {table} WHERE {purgeable}"
        );

        // An operator's forget ($4 force): one delete, deciding on the row as it is when
        // deleted (a concurrent claim's row version is re-checked by the delete itself), at
        // one "now". No row: absent, or a live lease without force (the store reads which).
        let forget = format!(
            "DELETE FROM {table} AS r USING {now_row} \
             WHERE r.consumer = $2 AND r.message_id = $3 \
               AND ($4::bool OR r.processed_at IS NOT NULL OR r.expires_at <= now.ms) \
             RETURNING now.ms AS now_ms, r.fence, r.attempt::bigint AS attempt, r.expires_at, r.processed_at, r.outcome"
        );

        // An operator's release ($4 the token read, $5 the new token, $6 force): the lease
        // expires and its token is replaced, so the old holder's commit, renew and release
        // find no row with their token; fence and attempt are kept (the next claim is a
        // takeover). No row: the record no longer holds that token, or its lease is live
        // and not forced.
        let revoke = format!(
            "UPDATE {table} AS r SET token = $5::uuid, expires_at = least(r.expires_at, now.ms) \
             FROM {now_row} \
             WHERE r.consumer = $2 AND r.message_id = $3 AND r.token = $4::uuid \
               AND r.processed_at IS NULL AND ($6::bool OR r.expires_at <= now.ms) \
             RETURNING r.fence"
        );

        // The lazy forms: the same text with `LAZY_COMMIT` as the source's condition.
        let lazy = |text: &str| text.replace("{lazy}", &format!("WHERE {LAZY_COMMIT} "));
        let claim_lazy = lazy(&claim);
        let claim_fresh_lazy = lazy(&claim_fresh);
        let claim_fresh = claim_fresh.replace("{lazy}", "");
        let claim_many_lazy = lazy(&claim_many);
        let claim = claim.replace("{lazy}", "");
        let claim_many = claim_many.replace("{lazy}", "");

        Statements {
            forget: sql(forget),
            claim_lazy: sql(claim_lazy),
            claim_many_lazy: sql(claim_many_lazy),
            revoke: sql(revoke),
            claim: sql(claim),
            claim_fresh: sql(claim_fresh),
            claim_fresh_lazy: sql(claim_fresh_lazy),
            commit_held: sql(commit_held),
            commit_held_in: Vec::new(),
            commit_many_in: Vec::new(),
            claim_many: sql(claim_many),
            claim_in_tx: sql(claim_in_tx),
            commit: sql(commit),
            commit_many: sql(commit_many),
            renew: sql(renew),
            release: sql(release),
            release_failed: sql(release_failed),
            get: sql(get),
            read_one: sql(read_one),
            read_many: sql(read_many),
            purge_batch: sql(purge_batch),
            count_purgeable: sql(count_purgeable),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{NOW_MS, record_cols};

    #[test]
    fn record_columns_are_selected_in_decoding_order() {
        assert_eq!(
            record_cols("r."),
            "r.token::text AS token, r.fence AS fence, r.attempt AS attempt, \
             r.expires_at AS expires_at, r.processed_at AS processed_at, r.outcome AS outcome, \
             r.fingerprint AS fingerprint, \
             coalesce(r.first_claimed_at, CASE WHEN r.fence = 1 THEN r.claimed_at END) \
             AS first_claimed_at, r.last_failure AS last_failure"
        );
    }

    /// The double-based "now" gives the millisecond the exact numeric computation gives, for
    /// times spread over the microseconds and for whole milliseconds (where a double falling
    /// just short of the millisecond would round down to the one before, which the half
    /// microsecond added guards against), today and in 2100.
    #[tokio::test]
    async fn server_now_is_the_exact_millisecond() {
        let Some(url) = dedup_conformance::server_url("DEDUP_POSTGRES_URL") else {
            eprintln!("SKIPPED: DEDUP_POSTGRES_URL is not set (see scripts/test.sh)");
            return;
        };
        let pool = sqlx::PgPool::connect(&url).await.expect("connect");
        let fast = NOW_MS
            .replace("$1::bigint", "NULL::bigint")
            .replace("clock_timestamp()", "x");
        let sql = format!(
            "SELECT count(*) FILTER (WHERE {fast} <> floor(extract(epoch FROM x) * 1000)::bigint), \
                    count(*) \
             FROM (SELECT timestamptz '2026-01-01 00:00:00+00' + i * interval '997 microseconds' AS x \
                   FROM generate_series(0, 1000000) i \
                   UNION ALL \
                   SELECT timestamptz '2026-12-01 00:00:00+00' + i * interval '1 millisecond' \
                   FROM generate_series(0, 200000) i \
                   UNION ALL \
                   SELECT timestamptz '2100-01-01 00:00:00+00' + i * interval '1001 microseconds' \
                   FROM generate_series(0, 200000) i) q"
        );
        let (mismatches, total): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_one(&pool)
            .await
            .expect("compare");
        assert_eq!(total, 1_400_003);
        assert_eq!(
            mismatches, 0,
            "the double-based now differs from the exact one"
        );
    }
}
