//! [`MySqlOutbox`]: the transactional outbox beside the store's table, the shared
//! [`SqlOutbox`] engine over [`MySqlOutboxDialect`] (MySQL / MariaDB statements; relays
//! poll, there are no wake-ups).

use async_trait::async_trait;
use dedup_core::backend::outbox::RawOutboxRow;
use dedup_core::outbox::OutboxMessage;
use dedup_core::{LeaseToken, Result, duration_millis};
use dedup_sql::outbox::{
    FailedPublish, OutboxDialect, OutboxTableState, RowFilter, SqlOutbox, Taken, decode_row,
};
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, Connection, MySqlConnection, Row};

use dedup_sql::SqlBackend;

use crate::error::{BACKEND, Backend, backend};
use crate::outbox_schema;
use crate::outbox_statements::OutboxStatements;
use crate::outbox_table::OutboxTable;
use crate::statements::{BEGIN, NOW_MS};
use crate::store::MySqlStore;

/// Messages per insert statement at most, and payload bytes per statement at most (well
/// under `max_allowed_packet`, and under the 65 535 parameters of a prepared statement).
const MAX_ROWS_PER_INSERT: usize = 500;
const MAX_BYTES_PER_INSERT: usize = 4 << 20;

/// The transactional outbox of a [`MySqlStore`] ([`MySqlStore::outbox`]), in its own table
/// in the connection's database
/// ([`SqlSettings::outbox_table`](crate::SqlSettings::outbox_table)), migrated with the
/// records table. MySQL has no `NOTIFY`: relays poll (their
/// [`poll_interval`](dedup_core::outbox::RelayConfig::poll_interval)) and look again at once
/// after a round that took rows. See [`SqlOutbox`] for `enqueue` and the contract,
/// [`MySqlOutboxDialect`] for what each operation costs here.
pub type MySqlOutbox = SqlOutbox<MySqlOutboxDialect>;

/// MySQL / MariaDB outbox statements for [`SqlOutbox`] (see [`MySqlOutbox`]).
///
/// **Enqueue.** One `INSERT IGNORE`, the messages as one multi-row `VALUES` in the caller's
/// order (so `AUTO_INCREMENT` ids follow it; a known message id writes nothing); before
/// it, when a message has an ordering key, one `INSERT ... ON DUPLICATE KEY UPDATE` of the
/// keys (sorted) into the outbox's keys table (`<outbox>_keys`), whose row locks last
/// until the caller's transaction ends (see [`SqlOutbox::enqueue`] for why). The keys
/// table keeps one small row per key ever used.
///
/// **Taking rows.** One short transaction of the store's own (READ COMMITTED): a `SELECT
/// ... FOR UPDATE SKIP LOCKED` of the due rows (a row another relay is taking at that
/// moment is passed over), then one `UPDATE` putting them under the hold. Marking rows
/// sent locks the rows still held (`FOR UPDATE`), then updates them, in one transaction
/// (no `UPDATE ... RETURNING` to say which ids changed). Both MariaDB (10.6 and later)
/// and MySQL (8.0.1 and later) have `SKIP LOCKED`.
#[derive(Clone, Debug)]
pub struct MySqlOutboxDialect {
    store: MySqlStore,
}

impl MySqlStore {
    /// The outbox beside this store's table (see [`MySqlOutbox`]).
    pub fn outbox(&self) -> MySqlOutbox {
        SqlOutbox::new(MySqlOutboxDialect {
            store: self.clone(),
        })
    }
}

impl MySqlOutboxDialect {
    fn state(&self) -> &OutboxTable {
        self.store.outbox_table()
    }

    fn sql(&self) -> &OutboxStatements {
        &self.state().sql
    }

    /// The store's "now" when it has an injected clock; else the server's, asked.
    async fn now_ms(&self, conn: &mut MySqlConnection) -> Result<i64> {
        if let Some(now) = self.store.now_param() {
            return Ok(now);
        }
        sqlx::query_scalar(AssertSqlSafe(format!("SELECT {NOW_MS}")))
            .bind(None::<i64>)
            .fetch_one(conn)
            .await
            .map_err(backend)
    }

    /// One take: a transaction of its own ([`MySqlOutboxDialect`]).
    async fn take_once(&self, token: &LeaseToken, limit: i64, hold_ms: i64) -> Result<Taken> {
        let now = self.store.now_param();
        let mut conn = self.store.pool().acquire().await.map_err(backend)?;
        let mut tx = Connection::begin_with(&mut *conn, BEGIN)
            .await
            .map_err(backend)?;
        let found = sqlx::query(AssertSqlSafe(self.sql().take.clone()))
            .bind(now)
            .bind(now)
            .bind(now)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .map_err(backend)?;
        let Some(first) = found.first() else {
            tx.commit().await.map_err(backend)?;
            return Ok(Taken {
                now_ms: self.now_ms(&mut conn).await?,
                rows: Vec::new(),
            });
        };
        let now_ms: i64 = first.try_get("now_ms").map_err(backend)?;
        let mut rows = found.iter().map(decode).collect::<Result<Vec<_>>>()?;
        let mut hold = sqlx::query(AssertSqlSafe(self.sql().hold(rows.len())))
            .bind(token.to_string())
            .bind(now_ms.saturating_add(hold_ms));
        for row in &rows {
            hold = hold.bind(row.id);
        }
        hold.execute(&mut *tx).await.map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        for row in &mut rows {
            row.state = "held".to_owned();
            row.attempts += 1;
        }
        Ok(Taken { now_ms, rows })
    }

    /// One marking of rows sent: a transaction of its own.
    async fn mark_sent_once(&self, token: &LeaseToken, ids: &[i64]) -> Result<Vec<i64>> {
        let now = self.store.now_param();
        let mut conn = self.store.pool().acquire().await.map_err(backend)?;
        let mut tx = Connection::begin_with(&mut *conn, BEGIN)
            .await
            .map_err(backend)?;
        let mut held = sqlx::query(AssertSqlSafe(self.sql().held(ids.len()))).bind(now);
        for id in ids {
            held = held.bind(id);
        }
        let held = held
            .bind(token.to_string())
            .bind(now)
            .fetch_all(&mut *tx)
            .await
            .map_err(backend)?;
        let Some(first) = held.first() else {
            tx.commit().await.map_err(backend)?;
            return Ok(Vec::new());
        };
        let now_ms: i64 = first.try_get("now_ms").map_err(backend)?;
        let marked = held
            .iter()
            .map(|row| row.try_get::<i64, _>("id").map_err(backend))
            .collect::<Result<Vec<_>>>()?;
        let mut mark = sqlx::query(AssertSqlSafe(self.sql().mark_sent(marked.len()))).bind(now_ms);
        for id in &marked {
            mark = mark.bind(id);
        }
        mark.execute(&mut *tx).await.map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(marked)
    }
}

/// How many times a take or a marking runs again after losing a race to a concurrent
/// writer, before its retryable error comes back.
const MAX_TRIES: u32 = 8;

/// Run `once` again while it fails with a conflict: a deadlock, or on a Galera cluster a
/// write set that failed certification at `COMMIT` because another relay took or marked
/// the same rows through another node. The next run reads what the winner committed.
async fn again_when_raced<T, F>(mut once: impl FnMut() -> F) -> Result<T>
where
    F: std::future::Future<Output = Result<T>>,
{
    let mut tries = 1;
    loop {
        match once().await {
            Err(e) if tries < MAX_TRIES && conflicted(&e) => tries += 1,
            done => return done,
        }
    }
}

/// Whether `error` is the driver's conflict ([`SqlBackend::is_conflict`]).
fn conflicted(error: &dedup_core::Error) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<sqlx::Error>())
        .is_some_and(<Backend as SqlBackend>::is_conflict)
}

/// One row of the outbox statements' row columns.
fn decode(row: &MySqlRow) -> Result<RawOutboxRow> {
    decode_row(row, BACKEND, backend)
}

/// `messages` in runs that each fit one insert statement.
fn chunks(messages: &[OutboxMessage]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, m) in messages.iter().enumerate() {
        let size = m.payload().len();
        if i > start && (i - start == MAX_ROWS_PER_INSERT || bytes + size > MAX_BYTES_PER_INSERT) {
            runs.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < messages.len() {
        runs.push(start..messages.len());
    }
    runs
}

#[async_trait]
impl OutboxDialect for MySqlOutboxDialect {
    type Backend = Backend;
    type Store = MySqlStore;

    fn store(&self) -> &MySqlStore {
        &self.store
    }

    fn table(&self) -> &OutboxTableState {
        &self.state().table
    }

    async fn check_table(&self, conn: &mut MySqlConnection) -> Result<()> {
        outbox_schema::check(conn, self.store.config()).await
    }

    async fn insert(
        &self,
        conn: &mut MySqlConnection,
        messages: &[OutboxMessage],
        headers: &[String],
    ) -> Result<u64> {
        let mut keys: Vec<&str> = messages
            .iter()
            .filter_map(|m| m.ordering_key_str())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        if !keys.is_empty() {
            let sql = self.sql().lock_keys(keys.len());
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for key in &keys {
                query = query.bind(*key);
            }
            query.execute(&mut *conn).await.map_err(backend)?;
        }
        let now = self.store.now_param();
        let mut written = 0;
        for run in chunks(messages) {
            let sql = self.sql().enqueue(run.len());
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for (m, h) in messages[run.clone()].iter().zip(&headers[run]) {
                query = query
                    .bind(m.destination())
                    .bind(m.message_id())
                    .bind(h.as_str())
                    .bind(m.payload())
                    .bind(m.ordering_key_str())
                    .bind(now)
                    .bind(now)
                    .bind(duration_millis(m.delay()));
            }
            written += query
                .execute(&mut *conn)
                .await
                .map_err(backend)?
                .rows_affected();
        }
        Ok(written)
    }

    async fn take(&self, token: &LeaseToken, limit: i64, hold_ms: i64) -> Result<Taken> {
        again_when_raced(|| self.take_once(token, limit, hold_ms)).await
    }

    async fn mark_sent(&self, token: &LeaseToken, ids: &[i64]) -> Result<Vec<i64>> {
        again_when_raced(|| self.mark_sent_once(token, ids)).await
    }

    async fn mark_failed(&self, token: &LeaseToken, failed: &FailedPublish<'_>) -> Result<bool> {
        let now = self.store.now_param();
        let done = sqlx::query(AssertSqlSafe(self.sql().mark_failed.clone()))
            .bind(failed.error)
            .bind(failed.dead)
            .bind(now)
            .bind(failed.delay_ms)
            .bind(failed.dead)
            .bind(failed.id)
            .bind(token.to_string())
            .bind(now)
            .execute(self.store.pool())
            .await
            .map_err(backend)?;
        Ok(done.rows_affected() == 1)
    }

    async fn hand_back(&self, token: &LeaseToken, ids: &[i64]) -> Result<u64> {
        let now = self.store.now_param();
        let mut query = sqlx::query(AssertSqlSafe(self.sql().hand_back(ids.len()))).bind(now);
        for id in ids {
            query = query.bind(id);
        }
        let done = query
            .bind(token.to_string())
            .bind(now)
            .execute(self.store.pool())
            .await
            .map_err(backend)?;
        Ok(done.rows_affected())
    }

    async fn list(&self, filter: &RowFilter<'_>) -> Result<Vec<RawOutboxRow>> {
        let rows = sqlx::query(AssertSqlSafe(self.sql().list.clone()))
            .bind(filter.after_id)
            .bind(filter.state)
            .bind(filter.state)
            .bind(filter.destination)
            .bind(filter.destination)
            .bind(filter.limit)
            .fetch_all(self.store.pool())
            .await
            .map_err(backend)?;
        rows.iter().map(decode).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_are_cut_by_rows_and_bytes() {
        let small = |i: usize| OutboxMessage::new("d", format!("m{i}"), vec![0; 10]).unwrap();
        let many: Vec<_> = (0..1001).map(small).collect();
        assert_eq!(chunks(&many), [0..500, 500..1000, 1000..1001]);
        let big = |i: usize| OutboxMessage::new("d", format!("b{i}"), vec![0; 1 << 20]).unwrap();
        let large: Vec<_> = (0..9).map(big).collect();
        assert_eq!(chunks(&large), [0..4, 4..8, 8..9]);
        assert!(chunks(&[]).is_empty());
    }
}
