//! The statements the store runs, rendered once for its table.
//!
//! The table name cannot be a bound parameter, so every template holds `{table}`, replaced
//! by the validated name (see [`SqliteConfig::validate`](crate::SqliteConfig::validate)).

/// The columns of a record, in the order [`crate::decode`] reads and writes them.
pub(crate) const COLUMNS: &str = "state, token, fence, attempt, expires_at, processed_at, \
     outcome, fingerprint, first_claimed_at, last_failure";
/// How many columns [`COLUMNS`] names: a select of `{COLUMNS}, consumer, message_id` has
/// the key at this index and the next.
pub(crate) const COLUMN_COUNT: usize = 10;

/// One key's record.
const SELECT: &str = "SELECT {columns} FROM \"{table}\" WHERE consumer = ?1 AND message_id = ?2";

/// Store a record as the reference model's `Write::Put` says: insert or replace every column.
const PUT: &str = "INSERT INTO \"{table}\" (consumer, message_id, {columns}) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) \
     ON CONFLICT (consumer, message_id) DO UPDATE SET \
     state = excluded.state, token = excluded.token, fence = excluded.fence, \
     attempt = excluded.attempt, expires_at = excluded.expires_at, \
     processed_at = excluded.processed_at, outcome = excluded.outcome, \
     fingerprint = excluded.fingerprint, first_claimed_at = excluded.first_claimed_at, \
     last_failure = excluded.last_failure";

/// One purge batch: at most ?3 rows that `transition::purgeable` accepts at now ?2 with
/// cutoff ?1 (= now - retention). Returns the state of every removed row.
const PURGE_BATCH: &str = "DELETE FROM \"{table}\" WHERE rowid IN ( \
     SELECT rowid FROM \"{table}\" WHERE {purgeable} LIMIT ?3) \
     RETURNING state";

/// The records a purge at `?2` (now) with cutoff `?1` removes, found through the purge
/// index on `coalesce(processed_at, expires_at)` (the explicit state tests keep a
/// record with an unexpected mix of columns out).
pub(crate) const PURGEABLE: &str = "coalesce(processed_at, expires_at) < ?1 \
     AND ((state = 'completed' AND processed_at < ?1) \
          OR (state = 'in_flight' AND expires_at < ?1 AND expires_at <= ?2))";

/// The transactional claim (?1 consumer, ?2 message id, ?3 now, ?4 fingerprint): insert a
/// completed row (first claimed now), or take over an in-flight row whose lease expired at
/// now, unless its fingerprint differs (the takeover keeps the first claim time). Returns the fence when the key was claimed, no row otherwise (the
/// caller then reads the record to tell in flight, completed and mismatch apart).
///
/// It writes before it reads, so even inside a deferred transaction it takes the write lock
/// first (waiting for it under the busy timeout) instead of failing on a stale snapshot.
const TX_CLAIM: &str = "INSERT INTO \"{table}\" (consumer, message_id, {columns}) \
     VALUES (?1, ?2, 'completed', NULL, 1, 1, NULL, ?3, NULL, ?4, ?3, NULL) \
     ON CONFLICT (consumer, message_id) DO UPDATE SET \
     state = 'completed', token = NULL, fence = fence + 1, attempt = attempt + 1, \
     expires_at = NULL, processed_at = excluded.processed_at, outcome = NULL, \
     fingerprint = COALESCE(excluded.fingerprint, fingerprint) \
     WHERE state = 'in_flight' AND expires_at <= excluded.processed_at \
       AND (excluded.fingerprint IS NULL OR fingerprint IS NULL \
            OR fingerprint = excluded.fingerprint) \
     RETURNING fence";

/// A claim of a key that has no record (?1 consumer, ?2 message id, ?3 token, ?4 expires at,
/// ?5 fingerprint, ?6 now): the first acquisition, fence 1, attempt 1, first claimed now,
/// in one statement. One row
/// changed means acquired; none means a record exists and the model decides from it.
const CLAIM_FRESH: &str = "INSERT INTO \"{table}\" (consumer, message_id, {columns}) \
     VALUES (?1, ?2, 'in_flight', ?3, 1, 1, ?4, NULL, NULL, ?5, ?6, NULL) \
     ON CONFLICT (consumer, message_id) DO NOTHING";

/// The commit (?1 consumer, ?2 message id, ?3 token, ?4 now, ?5 outcome), in lease mode and
/// inside the caller's transaction: complete the record if this token holds it in flight,
/// as `transition::commit` would (the token stays as the committing token). Writes first
/// for the same reason as [`TX_CLAIM`]; zero rows changed means "ask the model" (a retried
/// commit, or a lost lease).
const COMMIT: &str = "UPDATE \"{table}\" SET state = 'completed', expires_at = NULL, \
     processed_at = ?4, outcome = ?5 \
     WHERE consumer = ?1 AND message_id = ?2 AND state = 'in_flight' AND token = ?3";

/// Remove one key's record (?1 consumer, ?2 message id): an operator's forget, after
/// `transition::forget` decided on the record read in the same transaction.
const DELETE: &str = "DELETE FROM \"{table}\" WHERE consumer = ?1 AND message_id = ?2";

/// The statements of one store, rendered for its table.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) select: String,
    pub(crate) put: String,
    pub(crate) purge_batch: String,
    pub(crate) tx_claim: String,
    pub(crate) claim_fresh: String,
    pub(crate) commit: String,
    pub(crate) delete: String,
}

impl Statements {
    /// The statements for `table` (already validated as a safe identifier).
    pub(crate) fn new(table: &str) -> Self {
        let render = |template: &str| {
            template
                .replace("{columns}", COLUMNS)
                .replace("{purgeable}", PURGEABLE)
                .replace("{table}", table)
        };
        Statements {
            select: render(SELECT),
            put: render(PUT),
            purge_batch: render(PURGE_BATCH),
            tx_claim: render(TX_CLAIM),
            claim_fresh: render(CLAIM_FRESH),
            commit: render(COMMIT),
            delete: render(DELETE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_count_counts_the_columns() {
        assert_eq!(COLUMNS.split(',').count(), COLUMN_COUNT);
    }

    fn plan(conn: &rusqlite::Connection, sql: &str, params: impl rusqlite::Params) -> String {
        conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap()
            .query_map(params, |row| row.get::<_, String>(3))
            .unwrap()
            .collect::<rusqlite::Result<Vec<_>>>()
            .unwrap()
            .join("\n")
    }

    #[test]
    fn purge_and_lookups_use_indexes_not_table_scans() {
        let mut conn = rusqlite::Connection::open_in_memory().unwrap();
        crate::schema::migrate(&mut conn, "t").unwrap();
        let q = Statements::new("t");
        let purge = plan(&conn, &q.purge_batch, rusqlite::params![1, 2, 3]);
        assert!(purge.contains("INDEX t_purge_idx"), "{purge}");
        assert!(!purge.contains("SCAN"), "{purge}");
        let select = plan(&conn, &q.select, rusqlite::params!["c", "m"]);
        assert!(select.contains("INDEX sqlite_autoindex_t_1"), "{select}");
    }
}
