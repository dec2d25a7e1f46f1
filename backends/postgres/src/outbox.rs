//! [`PostgresOutbox`]: the transactional outbox in the store's schema. Producers
//! [`enqueue`](PostgresOutbox::enqueue) in their own transaction; a
//! [`Relay`](dedup_core::outbox::Relay) takes, marks and purges through
//! [`OutboxStore`](dedup_core::outbox::OutboxStore) (which the outbox's front door gives
//! for its [`OutboxStorage`] implementation), each operation one statement, and wakes on
//! `NOTIFY`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dedup_core::backend::outbox::RawOutboxRow;
use dedup_core::backend::{OutboxStorage, PurgeBatch, PurgeBatches, PurgeStep};
use dedup_core::outbox::{
    AfterFailure, Held, OutboxEntry, OutboxMessage, OutboxQuery, OutboxState, OutboxStats,
};
use dedup_core::{
    Error, LeaseToken, PurgeOptions, PurgeReport, Result, Timestamp, duration_millis,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use sqlx::postgres::{PgListener, PgRow};
use sqlx::{PgConnection, Row};
use tokio::sync::OnceCell;

use crate::config::PostgresConfig;
use crate::error::{BACKEND, backend};
use crate::outbox_schema;
use crate::outbox_statements::OutboxStatements;
use crate::schema::fnv1a;
use crate::statements::retention_param;
use crate::store::PostgresStore;

/// The outbox's table as the store knows it.
pub(crate) struct OutboxTable {
    /// `"schema"."table"`.
    qualified: String,
    /// The `NOTIFY` channel: `schema.table` when that fits PostgreSQL's 63 bytes, else the
    /// table's name.
    channel: String,
    sql: OutboxStatements,
    /// Set once the table is known to be current (migrated, or checked on first use).
    ready: OnceCell<()>,
    /// When this store last sent a `NOTIFY` (ms since `epoch`), for [`NOTIFY_EVERY`].
    last_notify_ms: AtomicU64,
    epoch: Instant,
}

/// At most one `NOTIFY` per this interval per store (see [`PostgresOutbox::enqueue`]).
pub const NOTIFY_EVERY: Duration = Duration::from_millis(10);

impl OutboxTable {
    pub(crate) fn new(config: &PostgresConfig) -> Self {
        let name = config.outbox_table_name();
        let qualified = config.qualified_outbox_table();
        let full = format!("{}.{name}", config.schema);
        OutboxTable {
            sql: OutboxStatements::new(&qualified),
            channel: if full.len() <= 63 { full } else { name },
            qualified,
            ready: OnceCell::new(),
            last_notify_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Whether this enqueue should notify: none was sent in the last [`NOTIFY_EVERY`].
    fn take_notify_turn(&self) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64 + NOTIFY_EVERY.as_millis() as u64;
        let last = self.last_notify_ms.load(Ordering::Relaxed);
        now >= last + NOTIFY_EVERY.as_millis() as u64
            && self
                .last_notify_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// The table was just migrated: no check needed.
    pub(crate) fn migrated(&self) {
        let _ = self.ready.set(());
    }
}

/// The transactional outbox of a [`PostgresStore`], in its own table in the store's schema
/// ([`PostgresConfig::outbox_table`], by default `dedup_inbox_outbox`), created and
/// migrated by [`PostgresStore::migrate`] with the records table.
///
/// Get it with [`PostgresStore::outbox`]; it shares the store's pool, configuration and
/// clock. Cheap to clone.
///
/// Producers write with [`enqueue`](Self::enqueue) inside their own transaction; a
/// [`Relay`](dedup_core::outbox::Relay) publishes through its
/// [`OutboxStore`](dedup_core::outbox::OutboxStore) implementation, woken by
/// [`wakeups`](dedup_core::outbox::OutboxStore::wakeups) (`LISTEN` on the table's channel)
/// as soon as a producer commits.
#[derive(Clone)]
pub struct PostgresOutbox {
    store: PostgresStore,
}

impl fmt::Debug for PostgresOutbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresOutbox")
            .field("table", &self.table())
            .field("store", &self.store)
            .finish()
    }
}

impl PostgresStore {
    /// The outbox in this store's schema (see [`PostgresOutbox`]).
    pub fn outbox(&self) -> PostgresOutbox {
        PostgresOutbox {
            store: self.clone(),
        }
    }
}

impl PostgresOutbox {
    /// The `"schema"."table"` of the outbox, quoted.
    pub fn table(&self) -> &str {
        &self.table_state().qualified
    }

    /// The channel producers `NOTIFY` and
    /// [`wakeups`](dedup_core::outbox::OutboxStore::wakeups) listens on.
    pub fn channel(&self) -> &str {
        &self.table_state().channel
    }

    fn table_state(&self) -> &OutboxTable {
        self.store.outbox_table()
    }

    fn sql(&self) -> &OutboxStatements {
        &self.table_state().sql
    }

    /// For a store that did not migrate: check the outbox table once before its first use.
    async fn ensure(&self) -> Result<()> {
        self.table_state()
            .ready
            .get_or_try_init(|| async {
                let mut conn = self.store.pool().acquire().await.map_err(backend)?;
                outbox_schema::check(&mut conn, self.store.config()).await
            })
            .await
            .map(|_| ())
    }

    /// Write `messages` to the outbox inside the caller's transaction (`&mut *tx` of a
    /// `sqlx::Transaction<'_, Postgres>`), next to its business rows: relays see them when
    /// it commits, and never if it rolls back. Returns how many rows were new: a message
    /// whose id is already in the outbox (in any state, until purged) writes nothing. One
    /// statement (`INSERT ... ON CONFLICT (message_id) DO NOTHING`), plus one that takes
    /// the ordering keys' locks when a message has one.
    ///
    /// **Ordering keys.** Row ids come from a sequence when a row is inserted, but rows
    /// become visible when their transaction commits; two transactions writing the same
    /// key could commit in the other order than their ids, and a relay, which publishes a
    /// key's rows by id and a row only once no earlier row of its key is pending, could
    /// then publish the later row first (the earlier was not yet visible). So, before
    /// inserting, `enqueue` takes a transaction-scoped advisory lock per ordering key
    /// (`pg_advisory_xact_lock` on a hash of the table and key, in sorted order): a second
    /// transaction writing the same key waits until the first commits or rolls back, and
    /// per key, id order is commit order. Keep such transactions short; messages without a
    /// key take no lock.
    ///
    /// **Wake-ups.** When a row was new, the statement also runs `pg_notify` on
    /// [`channel`](Self::channel), which PostgreSQL delivers when the transaction commits
    /// (and never on rollback): relays listening with
    /// [`wakeups`](dedup_core::outbox::OutboxStore::wakeups) take the rows at once instead
    /// of at their next poll. A transaction that notified takes a database-wide lock while it commits
    /// (PostgreSQL queues notifications in commit order), so notifying commits run one at
    /// a time; to keep concurrent producers from queueing behind it, one store sends at
    /// most one notification per [`NOTIFY_EVERY`] (10 ms). A row whose notification was
    /// skipped is taken by the relay's next look: relays look again
    /// [`RelayConfig::linger`](dedup_core::outbox::RelayConfig::linger) after a round that
    /// took rows, else at their poll interval.
    ///
    /// Written at, and due after each message's delay from, the store's "now" (the server's
    /// clock unless one is injected).
    pub async fn enqueue(
        &self,
        conn: &mut PgConnection,
        messages: &[OutboxMessage],
    ) -> Result<u64> {
        if messages.is_empty() {
            return Ok(0);
        }
        self.ensure().await?;
        let mut keys: Vec<i64> = messages
            .iter()
            .filter_map(|m| m.ordering_key_str())
            .map(|k| self.key_lock(k))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        if !keys.is_empty() {
            sqlx::query(self.sql().lock_keys.clone())
                .bind(&keys)
                .execute(&mut *conn)
                .await
                .map_err(backend)?;
        }
        let headers = messages
            .iter()
            .map(|m| {
                serde_json::to_string(m.headers()).map_err(|e| Error::backend(BACKEND, false, e))
            })
            .collect::<Result<Vec<_>>>()?;
        let row = sqlx::query(self.sql().enqueue.clone())
            .bind(self.store.now_param())
            .bind(messages.iter().map(|m| m.destination()).collect::<Vec<_>>())
            .bind(messages.iter().map(|m| m.message_id()).collect::<Vec<_>>())
            .bind(headers)
            .bind(messages.iter().map(|m| m.payload()).collect::<Vec<_>>())
            .bind(
                messages
                    .iter()
                    .map(|m| m.ordering_key_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                messages
                    .iter()
                    .map(|m| duration_millis(m.delay()))
                    .collect::<Vec<_>>(),
            )
            .bind(
                self.table_state()
                    .take_notify_turn()
                    .then(|| self.channel()),
            )
            .fetch_one(&mut *conn)
            .await
            .map_err(backend)?;
        let written: i64 = row.try_get("written").map_err(backend)?;
        Ok(u64::try_from(written).unwrap_or(0))
    }

    /// The advisory lock key of an ordering key in this outbox.
    fn key_lock(&self, key: &str) -> i64 {
        let text = format!("dedup-postgres outbox {} {key}", self.table());
        i64::from_ne_bytes(fnv1a(text.as_bytes()).to_ne_bytes())
    }
}

/// One row of the outbox statements' row columns.
fn decode(row: &PgRow) -> Result<OutboxEntry> {
    let id: i64 = row.try_get("id").map_err(backend)?;
    let headers: String = row.try_get("headers").map_err(backend)?;
    let headers = serde_json::from_str(&headers).map_err(|e| {
        Error::backend(
            BACKEND,
            false,
            format!("outbox row {id} has unreadable headers: {e}"),
        )
    })?;
    let attempts: i32 = row.try_get("attempts").map_err(backend)?;
    RawOutboxRow {
        id,
        destination: row.try_get("destination").map_err(backend)?,
        message_id: row.try_get("message_id").map_err(backend)?,
        headers,
        payload: row.try_get("payload").map_err(backend)?,
        ordering_key: row.try_get("ordering_key").map_err(backend)?,
        written_at: row.try_get("written_at").map_err(backend)?,
        attempts: i64::from(attempts),
        state: row.try_get("state").map_err(backend)?,
        due_at: row.try_get("due_at").map_err(backend)?,
        sent_at: row.try_get("sent_at").map_err(backend)?,
        last_error: row.try_get("last_error").map_err(backend)?,
    }
    .decode(BACKEND)
}

fn sql_limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[async_trait]
impl OutboxStorage for PostgresOutbox {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn take(&self, limit: usize, hold: Duration) -> Result<Held> {
        self.ensure().await?;
        let token = LeaseToken::random();
        let hold_ms = duration_millis(hold);
        let rows = sqlx::query(self.sql().take.clone())
            .bind(self.store.now_param())
            .bind(token.to_string())
            .bind(sql_limit(limit))
            .bind(hold_ms)
            .fetch_all(self.store.pool())
            .await
            .map_err(backend)?;
        let mut now = None;
        let mut taken = Vec::new();
        for row in &rows {
            now = Some(row.try_get::<i64, _>("now_ms").map_err(backend)?);
            if row
                .try_get::<Option<i64>, _>("id")
                .map_err(backend)?
                .is_some()
            {
                taken.push(decode(row)?);
            }
        }
        let now = now.ok_or_else(|| {
            Error::backend(BACKEND, true, "the outbox take returned no row at all")
        })?;
        taken.sort_by_key(|e| (e.due_at, e.row.id));
        Ok(Held {
            token,
            until: Timestamp::from_millis(now.saturating_add(hold_ms)),
            rows: taken.into_iter().map(|e| e.row).collect(),
        })
    }

    async fn mark_sent(&self, token: &LeaseToken, ids: &[i64]) -> Result<Vec<i64>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.ensure().await?;
        let marked: Vec<i64> = sqlx::query_scalar(self.sql().mark_sent.clone())
            .bind(self.store.now_param())
            .bind(token.to_string())
            .bind(ids)
            .fetch_all(self.store.pool())
            .await
            .map_err(backend)?;
        // In the caller's order.
        Ok(ids
            .iter()
            .copied()
            .filter(|id| marked.contains(id))
            .fold(Vec::new(), |mut out, id| {
                if !out.contains(&id) {
                    out.push(id);
                }
                out
            }))
    }

    async fn mark_failed(
        &self,
        token: &LeaseToken,
        id: i64,
        error: &str,
        after: AfterFailure,
    ) -> Result<bool> {
        self.ensure().await?;
        let (dead, delay) = match after {
            AfterFailure::Dead => (true, 0),
            AfterFailure::RetryAfter(delay) => (false, duration_millis(delay)),
        };
        let done = sqlx::query(self.sql().mark_failed.clone())
            .bind(self.store.now_param())
            .bind(token.to_string())
            .bind(id)
            .bind(error)
            .bind(dead)
            .bind(delay)
            .execute(self.store.pool())
            .await
            .map_err(backend)?;
        Ok(done.rows_affected() == 1)
    }

    async fn hand_back(&self, token: &LeaseToken, ids: &[i64]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        self.ensure().await?;
        let done = sqlx::query(self.sql().hand_back.clone())
            .bind(self.store.now_param())
            .bind(token.to_string())
            .bind(ids)
            .execute(self.store.pool())
            .await
            .map_err(backend)?;
        Ok(done.rows_affected())
    }

    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        dedup_core::backend::purge::run(self, options).await
    }

    async fn stats(&self) -> Result<OutboxStats> {
        self.ensure().await?;
        let rows = sqlx::query(self.sql().stats.clone())
            .bind(self.store.now_param())
            .fetch_all(self.store.pool())
            .await
            .map_err(backend)?;
        let mut stats = OutboxStats::default();
        for row in &rows {
            stats.now = Timestamp::from_millis(row.try_get("now_ms").map_err(backend)?);
            let Some(state) = row.try_get::<Option<String>, _>("state").map_err(backend)? else {
                continue;
            };
            let n: i64 = row.try_get("n").map_err(backend)?;
            let n = u64::try_from(n).unwrap_or(0);
            let oldest: Option<i64> = row.try_get("oldest").map_err(backend)?;
            let unsent = match OutboxState::parse(&state) {
                Some(OutboxState::Pending) => {
                    stats.pending = n;
                    true
                }
                Some(OutboxState::Held) => {
                    stats.held = n;
                    true
                }
                Some(OutboxState::Sent) => {
                    stats.sent = n;
                    false
                }
                Some(OutboxState::Dead) => {
                    stats.dead = n;
                    false
                }
                None => {
                    return Err(Error::backend(
                        BACKEND,
                        false,
                        format!("outbox rows in an unknown state {state:?}"),
                    ));
                }
            };
            if let (true, Some(w)) = (unsent, oldest) {
                let w = Timestamp::from_millis(w);
                stats.oldest_unsent = Some(stats.oldest_unsent.map_or(w, |o| o.min(w)));
            }
        }
        Ok(stats)
    }

    async fn list(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>> {
        let limit = query.limit;
        self.ensure().await?;
        let rows = sqlx::query(self.sql().list.clone())
            .bind(query.state.map(OutboxState::as_str))
            .bind(query.destination.as_deref())
            .bind(query.after_id.unwrap_or(i64::MIN))
            .bind(sql_limit(limit))
            .fetch_all(self.store.pool())
            .await
            .map_err(backend)?;
        rows.iter().map(decode).collect()
    }

    async fn retry(&self, id: i64) -> Result<bool> {
        self.ensure().await?;
        let done = sqlx::query(self.sql().retry.clone())
            .bind(self.store.now_param())
            .bind(id)
            .execute(self.store.pool())
            .await
            .map_err(backend)?;
        Ok(done.rows_affected() == 1)
    }

    /// A `LISTEN` on [`PostgresOutbox::channel`] over a connection of its own, as a stream
    /// of `Ok(())`: one item per notification (per committed enqueue that wrote rows). sqlx
    /// reconnects a dropped listener by itself (notifications sent meanwhile are lost: the
    /// relay's polling covers them); the first error it cannot recover from (the server
    /// shut down, or is still down) is the stream's last item, and the relay listens again
    /// once the server answers.
    async fn wakeups(&self) -> Result<Option<BoxStream<'static, Result<()>>>> {
        let mut listener = PgListener::connect_with(self.store.pool())
            .await
            .map_err(backend)?;
        listener.listen(self.channel()).await.map_err(backend)?;
        let stream = listener
            .into_stream()
            .map(|n| n.map(|_| ()).map_err(backend));
        Ok(Some(stream.boxed()))
    }
}

#[async_trait]
impl PurgeBatches for PostgresOutbox {
    type PurgeCursor = ();

    /// One statement deleting at most `step.limit` rows sent before the cutoff, oldest
    /// first. Removed rows count as `completed`.
    async fn purge_batch(&self, step: &PurgeStep, _: &mut ()) -> Result<PurgeBatch> {
        self.ensure().await?;
        let mut conn = self.store.pool().acquire().await.map_err(backend)?;
        let started = Instant::now();
        let done = sqlx::query(self.sql().purge_batch.clone())
            .bind(self.store.now_param())
            .bind(retention_param(step.retention))
            .bind(sql_limit(step.limit))
            .execute(&mut *conn)
            .await
            .map_err(backend)?;
        let removed = done.rows_affected();
        Ok(PurgeBatch {
            completed: removed,
            exhausted: removed < step.limit as u64,
            work: Some(started.elapsed()),
            ..PurgeBatch::default()
        })
    }
}
