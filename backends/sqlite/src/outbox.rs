//! [`SqliteOutbox`]: the transactional outbox on the store's database file. Producers
//! [`enqueue`](SqliteOutbox::enqueue) in their own transaction; a
//! [`Relay`](dedup_core::outbox::Relay) takes, marks and purges through
//! [`OutboxStore`](dedup_core::outbox::OutboxStore), which the outbox's front door gives
//! for its [`OutboxStorage`] implementation.
//!
//! Every relay operation is a write transaction through the store's write queue (the same
//! queue and `BEGIN IMMEDIATE` transactions as the records', see [`crate::writes`]): SQLite
//! has one writer, so a take's "which rows are due and first of their ordering key" and its
//! update cannot interleave with another take. Reads (stats, listings) use a pooled
//! connection.

use std::fmt;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dedup_core::backend::outbox::RawOutboxRow;
use dedup_core::backend::{OutboxStorage, PurgeBatch, PurgeBatches, PurgeStep};
use dedup_core::outbox::{
    AfterFailure, DestinationStats, DestinationTally, Held, OutboxEntry, OutboxMessage,
    OutboxQuery, OutboxState, OutboxStats,
};
use dedup_core::{
    Error, LeaseToken, PurgeOptions, PurgeReport, Result, Timestamp, duration_millis,
};
use rusqlite::{Connection, Row, params};

use crate::error::{BACKEND, backend};
use crate::store::SqliteStore;
use crate::writes::in_transaction;

/// The transactional outbox in a [`SqliteStore`]'s database file, in its own table
/// ([`SqliteConfig::outbox_table`](crate::SqliteConfig::outbox_table), by default
/// `dedup_inbox_outbox`), created and migrated with the records table.
///
/// Get it with [`SqliteStore::outbox`]; it shares the store's connections, write queue,
/// configuration and clock. Cheap to clone.
///
/// Producers write with [`enqueue`](Self::enqueue) inside their own transaction; a
/// [`Relay`](dedup_core::outbox::Relay) publishes through its
/// [`OutboxStore`](dedup_core::outbox::OutboxStore) implementation. There is no wake-up
/// signal on SQLite ([`wakeups`](dedup_core::outbox::OutboxStore::wakeups) is `None`):
/// relays poll.
#[derive(Clone)]
pub struct SqliteOutbox {
    store: SqliteStore,
}

impl fmt::Debug for SqliteOutbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteOutbox")
            .field("table", &self.store.inner.outbox.table)
            .field("store", &self.store)
            .finish()
    }
}

impl SqliteStore {
    /// The outbox in this store's database file (see [`SqliteOutbox`]).
    pub fn outbox(&self) -> SqliteOutbox {
        SqliteOutbox {
            store: self.clone(),
        }
    }
}

impl SqliteOutbox {
    /// The outbox's table.
    pub fn table(&self) -> &str {
        &self.store.inner.outbox.table
    }

    /// Write `messages` to the outbox inside the caller's transaction on `conn` (a
    /// `&rusqlite::Transaction` derefs to it), next to the caller's business rows: they
    /// become visible to relays when it commits, and never if it rolls back. Returns how
    /// many rows were new: a message whose id is already in the outbox (in any state, until
    /// purged) writes nothing.
    ///
    /// The messages are written under a savepoint, so all or none of them are; on a
    /// connection outside a transaction they commit together as one transaction of their
    /// own. `conn` must be on this store's database file (see
    /// [`SqliteStore::open_connection`], or the transaction a
    /// [`TxInbox`](crate::TxInbox) handler gets). Rows of one ordering key are published
    /// in the order of their ids, which on SQLite (one writer) is their commit order.
    ///
    /// Written at, and due after each message's delay from, the store's clock read now.
    /// Synchronous, like the rest of rusqlite: call it where the transaction lives.
    pub fn enqueue(&self, conn: &Connection, messages: &[OutboxMessage]) -> Result<u64> {
        if messages.is_empty() {
            return Ok(0);
        }
        let inner = &self.store.inner;
        inner.outbox.ensure(conn)?;
        let now = inner.clock.now();
        let rows = messages
            .iter()
            .map(|m| Ok((m, encode_headers(m.headers())?)))
            .collect::<Result<Vec<_>>>()?;
        conn.execute_batch("SAVEPOINT dedup_outbox_enqueue")
            .map_err(backend)?;
        let written = (|| -> rusqlite::Result<usize> {
            let mut stmt = conn.prepare_cached(&inner.outbox.sql.enqueue)?;
            let mut n = 0;
            for (m, headers) in &rows {
                n += stmt.execute(params![
                    m.destination(),
                    m.message_id(),
                    headers,
                    m.payload(),
                    m.ordering_key_str(),
                    now.as_millis(),
                    now.saturating_add(m.delay()).as_millis(),
                ])?;
            }
            Ok(n)
        })();
        match written {
            Ok(n) => {
                conn.execute_batch("RELEASE dedup_outbox_enqueue")
                    .map_err(backend)?;
                Ok(n as u64)
            }
            Err(e) => {
                // Undo this call's rows, keep the caller's transaction as it was.
                let _ = conn.execute_batch(
                    "ROLLBACK TO dedup_outbox_enqueue; RELEASE dedup_outbox_enqueue",
                );
                Err(backend(e))
            }
        }
    }
}

/// Headers as stored: a JSON array of `[name, value]` pairs.
fn encode_headers(headers: &[(String, String)]) -> Result<String> {
    serde_json::to_string(headers).map_err(|e| Error::backend(BACKEND, false, e))
}

/// One row of the outbox statements' `{row}` columns.
fn decode(row: &Row<'_>) -> Result<OutboxEntry> {
    let id: i64 = row.get(0).map_err(backend)?;
    let headers: String = row.get(3).map_err(backend)?;
    let headers = serde_json::from_str(&headers).map_err(|e| {
        Error::backend(
            BACKEND,
            false,
            format!("outbox row {id} has unreadable headers: {e}"),
        )
    })?;
    RawOutboxRow {
        id,
        destination: row.get(1).map_err(backend)?,
        message_id: row.get(2).map_err(backend)?,
        headers,
        payload: row.get(4).map_err(backend)?,
        ordering_key: row.get(5).map_err(backend)?,
        written_at: row.get(6).map_err(backend)?,
        attempts: row.get(7).map_err(backend)?,
        state: row.get(8).map_err(backend)?,
        due_at: row.get(9).map_err(backend)?,
        sent_at: row.get(10).map_err(backend)?,
        last_error: row.get(11).map_err(backend)?,
    }
    .decode(BACKEND)
}

/// Every row a statement returned.
fn decode_all(mut rows: rusqlite::Rows<'_>) -> Result<Vec<OutboxEntry>> {
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(backend)? {
        out.push(decode(row)?);
    }
    Ok(out)
}

fn sql_limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[async_trait]
impl OutboxStorage for SqliteOutbox {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn take(&self, limit: usize, hold: Duration) -> Result<Held> {
        let token = LeaseToken::random();
        let (until, mut taken) = self
            .store
            .write(move |conn, inner, now| {
                inner.outbox.ensure(conn)?;
                let until = now.saturating_add(hold);
                let mut stmt = conn
                    .prepare_cached(&inner.outbox.sql.take)
                    .map_err(backend)?;
                let rows = stmt
                    .query(params![
                        now.as_millis(),
                        token.to_string(),
                        until.as_millis(),
                        sql_limit(limit),
                    ])
                    .map_err(backend)?;
                Ok((until, decode_all(rows)?))
            })
            .await?;
        // RETURNING's order is the update's, not the selection's.
        taken.sort_by_key(|e| (e.due_at, e.row.id));
        Ok(Held {
            token,
            until,
            rows: taken.into_iter().map(|e| e.row).collect(),
        })
    }

    async fn mark_sent(&self, token: &LeaseToken, ids: &[i64]) -> Result<Vec<i64>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let (token, ids) = (token.to_string(), ids.to_vec());
        self.store
            .write(move |conn, inner, now| {
                inner.outbox.ensure(conn)?;
                let mut stmt = conn
                    .prepare_cached(&inner.outbox.sql.mark_sent)
                    .map_err(backend)?;
                let mut marked = Vec::new();
                for id in &ids {
                    if stmt
                        .execute(params![now.as_millis(), token, id])
                        .map_err(backend)?
                        == 1
                    {
                        marked.push(*id);
                    }
                }
                Ok(marked)
            })
            .await
    }

    async fn mark_failed(
        &self,
        token: &LeaseToken,
        id: i64,
        error: &str,
        after: AfterFailure,
    ) -> Result<bool> {
        let (token, error) = (token.to_string(), error.to_owned());
        self.store
            .write(move |conn, inner, now| {
                inner.outbox.ensure(conn)?;
                let (dead, due) = match after {
                    AfterFailure::Dead => (true, now),
                    AfterFailure::RetryAfter(delay) => (false, now.saturating_add(delay)),
                };
                let changed = conn
                    .prepare_cached(&inner.outbox.sql.mark_failed)
                    .and_then(|mut stmt| {
                        stmt.execute(params![
                            now.as_millis(),
                            token,
                            id,
                            error,
                            dead,
                            due.as_millis(),
                        ])
                    })
                    .map_err(backend)?;
                Ok(changed == 1)
            })
            .await
    }

    async fn hand_back(&self, token: &LeaseToken, ids: &[i64]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let (token, ids) = (token.to_string(), ids.to_vec());
        self.store
            .write(move |conn, inner, now| {
                inner.outbox.ensure(conn)?;
                let mut stmt = conn
                    .prepare_cached(&inner.outbox.sql.hand_back)
                    .map_err(backend)?;
                let mut n = 0;
                for id in &ids {
                    n += stmt
                        .execute(params![now.as_millis(), token, id])
                        .map_err(backend)? as u64;
                }
                Ok(n)
            })
            .await
    }

    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        dedup_core::backend::purge::run(self, options).await
    }

    async fn stats(&self) -> Result<OutboxStats> {
        self.store
            .run(false, |conn, inner| {
                inner.outbox.ensure(conn)?;
                let mut stats = OutboxStats {
                    now: inner.clock.now(),
                    ..OutboxStats::default()
                };
                for_each_count(conn, &inner.outbox.sql.stats, |_, c| {
                    stats.count_state(BACKEND, &c.state, c.rows, c.oldest)
                })?;
                Ok(stats)
            })
            .await
    }

    async fn stats_by_destination(&self) -> Result<Vec<DestinationStats>> {
        self.store
            .run(false, |conn, inner| {
                inner.outbox.ensure(conn)?;
                let mut tally = DestinationTally::at(inner.clock.now());
                let sql = &inner.outbox.sql.stats_by_destination;
                for_each_count(conn, sql, |row, c| {
                    let destination: String = row.get(3).map_err(backend)?;
                    tally.add(BACKEND, &destination, &c.state, c.rows, c.oldest)
                })?;
                Ok(tally.finish())
            })
            .await
    }

    async fn list(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>> {
        let limit = query.limit;
        let query = query.clone();
        self.store
            .run(false, move |conn, inner| {
                inner.outbox.ensure(conn)?;
                let mut stmt = conn
                    .prepare_cached(&inner.outbox.sql.list)
                    .map_err(backend)?;
                let rows = stmt
                    .query(params![
                        query.state.map(OutboxState::as_str),
                        query.destination,
                        query.after_id.unwrap_or(i64::MIN),
                        sql_limit(limit),
                    ])
                    .map_err(backend)?;
                decode_all(rows)
            })
            .await
    }

    async fn retry(&self, id: i64) -> Result<bool> {
        self.store
            .write(move |conn, inner, now| {
                inner.outbox.ensure(conn)?;
                let changed = conn
                    .prepare_cached(&inner.outbox.sql.retry)
                    .and_then(|mut stmt| stmt.execute(params![now.as_millis(), id]))
                    .map_err(backend)?;
                Ok(changed == 1)
            })
            .await
    }
}

#[async_trait]
impl PurgeBatches for SqliteOutbox {
    type PurgeCursor = ();

    /// One short write transaction per batch, taking the store's write gate like the
    /// records' purge batches. Removed rows count as `completed`.
    async fn purge_batch(&self, step: &PurgeStep, _: &mut ()) -> Result<PurgeBatch> {
        let (retention, limit) = (step.retention, step.limit);
        self.store
            .run(true, move |conn, inner| {
                let started = Instant::now();
                let removed = in_transaction(conn, |tx| {
                    inner.outbox.ensure(tx)?;
                    let now = inner.clock.now();
                    let cutoff = now.as_millis().saturating_sub(duration_millis(retention));
                    tx.prepare_cached(&inner.outbox.sql.purge_batch)
                        .and_then(|mut stmt| stmt.execute(params![cutoff, sql_limit(limit)]))
                        .map_err(backend)
                })?;
                Ok(PurgeBatch {
                    completed: removed as u64,
                    exhausted: removed < limit,
                    work: Some(started.elapsed()),
                    ..PurgeBatch::default()
                })
            })
            .await
    }
}

/// One row of a counting statement: its first three columns.
struct Count {
    state: String,
    rows: u64,
    oldest: Option<Timestamp>,
}

/// Run the counting statement `sql` (`state, count(*), min(written_at), ...`) and hand each
/// row, with its first three columns read, to `each`.
fn for_each_count(
    conn: &rusqlite::Connection,
    sql: &str,
    mut each: impl FnMut(&rusqlite::Row<'_>, Count) -> Result<()>,
) -> Result<()> {
    let mut stmt = conn.prepare_cached(sql).map_err(backend)?;
    let mut rows = stmt.query([]).map_err(backend)?;
    while let Some(row) = rows.next().map_err(backend)? {
        let count: i64 = row.get(1).map_err(backend)?;
        let oldest: Option<i64> = row.get(2).map_err(backend)?;
        let counted = Count {
            state: row.get(0).map_err(backend)?,
            rows: u64::try_from(count).unwrap_or(0),
            oldest: oldest.map(Timestamp::from_millis),
        };
        each(row, counted)?;
    }
    Ok(())
}
