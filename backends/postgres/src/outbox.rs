//! [`PostgresOutbox`]: the transactional outbox in the store's schema, the shared
//! [`SqlOutbox`] engine over [`PostgresOutboxDialect`] (PostgreSQL's statements, each
//! operation one statement, and `NOTIFY` / `LISTEN` wake-ups).

use std::time::Duration;

use async_trait::async_trait;
use dedup_core::backend::outbox::RawOutboxRow;
use dedup_core::outbox::OutboxMessage;
use dedup_core::{Error, LeaseToken, Result, duration_millis};
use dedup_sql::outbox::{
    FailedPublish, OutboxDialect, OutboxTableState, RowFilter, SqlOutbox, Taken, decode_row,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use sqlx::postgres::{PgListener, PgRow};
use sqlx::{PgConnection, Row};

use crate::ddl::fnv1a;
use crate::error::{BACKEND, Backend, backend};
use crate::outbox_schema;
use crate::outbox_statements::OutboxStatements;
use crate::outbox_table::{OutboxTable, TRAILING_FIRST, TRAILING_MOST};
use crate::store::PostgresStore;

/// The transactional outbox of a [`PostgresStore`] ([`PostgresStore::outbox`]), in its own
/// table in the store's schema
/// ([`SqlSettings::outbox_table`](crate::SqlSettings::outbox_table)), migrated with
/// the records table; relays are woken by `LISTEN` on the table's
/// [`channel`](PostgresOutboxDialect::channel). See [`SqlOutbox`] for `enqueue` and the
/// contract, [`PostgresOutboxDialect`] for what each operation costs here.
pub type PostgresOutbox = SqlOutbox<PostgresOutboxDialect>;

/// PostgreSQL's outbox statements for [`SqlOutbox`] (see [`PostgresOutbox`]); each
/// operation is one statement.
///
/// **Enqueue.** `INSERT ... ON CONFLICT (message_id) DO NOTHING` over arrays of the
/// messages' columns; before it, when a message has an ordering key, the keys' locks:
/// `pg_advisory_xact_lock` on a hash of the table and key, in sorted order, held until the
/// caller's transaction ends (see [`SqlOutbox::enqueue`] for why).
///
/// **Wake-ups.** When a row was new, the statement also runs `pg_notify` on
/// [`channel`](Self::channel), which PostgreSQL delivers when the transaction commits (and
/// never on rollback): relays listening with
/// [`wakeups`](dedup_core::outbox::OutboxStore::wakeups) take the rows at once instead of
/// at their next poll. A transaction that notified takes a database-wide lock while it
/// commits (PostgreSQL queues notifications in commit order), so notifying commits run one
/// at a time; to keep concurrent producers from queueing behind it, one store notifies
/// from a producer's transaction at most once per [`NOTIFY_EVERY`](crate::NOTIFY_EVERY)
/// (5 ms). A producer whose notification was skipped gets a trailing one once its
/// transaction committed: the next producer that notifies looks at the skipped
/// transactions in its own statement (`txid_status`; those committed are covered by its
/// notification), and when none notifies in a window, a statement of the store's own does
/// it at the window's end, notifies when any committed, and looks again at those still
/// open (5 ms later, doubling to 50 ms). So such a row is taken
/// within tens of ms even when its producer commits after the relay looked again
/// ([`RelayConfig::linger`](dedup_core::outbox::RelayConfig::linger)), not at the relay's
/// next poll.
#[derive(Clone, Debug)]
pub struct PostgresOutboxDialect {
    store: PostgresStore,
}

impl PostgresStore {
    /// The outbox in this store's schema (see [`PostgresOutbox`]).
    pub fn outbox(&self) -> PostgresOutbox {
        SqlOutbox::new(PostgresOutboxDialect {
            store: self.clone(),
        })
    }
}

impl PostgresOutboxDialect {
    /// The channel producers `NOTIFY` and
    /// [`wakeups`](dedup_core::outbox::OutboxStore::wakeups) listens on.
    pub fn channel(&self) -> &str {
        &self.state().channel
    }

    fn state(&self) -> &OutboxTable {
        self.store.outbox_table()
    }

    fn sql(&self) -> &OutboxStatements {
        &self.state().sql
    }

    /// The advisory lock key of an ordering key in this outbox.
    fn key_lock(&self, key: &str) -> i64 {
        let text = format!("dedup-postgres outbox {} {key}", self.state().table.name());
        i64::from_ne_bytes(fnv1a(text.as_bytes()).to_ne_bytes())
    }
}

impl PostgresOutboxDialect {
    /// Start the task that sends the trailing notification of the producers whose own was
    /// skipped. At the end of each [`NOTIFY_EVERY`](crate::NOTIFY_EVERY) window whose turn
    /// no producer took, one statement looks at their transactions and notifies when any
    /// committed; it looks again at those still open, 5 ms later doubling to 50 ms, until
    /// none is left. A producer that takes the turn looks at them in its own enqueue.
    fn spawn_trailing(&self) {
        /// Forgets the skipped transactions if the task ends before it settled them (its
        /// runtime shut down), so that the next skip starts another task.
        struct Abandon(Option<PostgresStore>);
        impl Drop for Abandon {
            fn drop(&mut self) {
                if let Some(store) = self.0.take() {
                    store.outbox_table().abandon();
                }
            }
        }
        let store = self.store.clone();
        tokio::spawn(async move {
            let mut guard = Abandon(Some(store.clone()));
            let table = store.outbox_table();
            let mut wait = Duration::ZERO;
            loop {
                tokio::time::sleep(table.until_window_ends().max(wait)).await;
                let looked = table.skipped_xacts();
                // A producer took this window's turn: its enqueue looks at them.
                if !looked.is_empty() && table.take_notify_turn() {
                    // Failed (the server is away): the rows wait for the relay's poll,
                    // as without notifications.
                    let open = trailing(&store, &looked).await.unwrap_or_default();
                    table.settle(&looked, &open);
                    wait = (wait * 2).clamp(TRAILING_FIRST, TRAILING_MOST);
                }
                if !table.settle(&[], &[]) {
                    guard.0 = None;
                    return;
                }
            }
        });
    }
}

/// One look at the skipped transactions `xacts`: a `NOTIFY` when any committed, and those
/// still open.
async fn trailing(store: &PostgresStore, xacts: &[i64]) -> Result<Vec<i64>> {
    let table = store.outbox_table();
    let row = sqlx::query(table.sql.trailing.clone())
        .bind(&table.channel)
        .bind(xacts)
        .fetch_one(store.pool())
        .await
        .map_err(backend)?;
    row.try_get("open").map_err(backend)
}

/// One row of the outbox statements' row columns.
fn decode(row: &PgRow) -> Result<RawOutboxRow> {
    decode_row(row, BACKEND, backend)
}

#[async_trait]
impl OutboxDialect for PostgresOutboxDialect {
    type Backend = Backend;
    type Store = PostgresStore;

    fn store(&self) -> &PostgresStore {
        &self.store
    }

    fn table(&self) -> &OutboxTableState {
        &self.state().table
    }

    async fn check_table(&self, conn: &mut PgConnection) -> Result<()> {
        outbox_schema::check(conn, self.store.config()).await
    }

    async fn insert(
        &self,
        conn: &mut PgConnection,
        messages: &[OutboxMessage],
        headers: &[String],
    ) -> Result<u64> {
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
        let turn = self.state().take_notify_turn();
        // The producer that notifies looks at the skipped transactions for the trailing
        // task: under steady traffic that task then sends no statement of its own.
        let looked = match turn {
            true => self.state().skipped_xacts(),
            false => Vec::new(),
        };
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
            .bind(turn.then(|| self.channel()))
            .bind(&looked)
            .fetch_one(&mut *conn)
            .await
            .map_err(backend)?;
        let written: i64 = row.try_get("written").map_err(backend)?;
        if written > 0 && !looked.is_empty() {
            // Settled now: should this transaction roll back, its notification is lost with
            // it, and the rows of those committed wait for the relay's poll.
            let open: Vec<i64> = row.try_get("still_open").map_err(backend)?;
            self.state().settle(&looked, &open);
        }
        let xact: Option<i64> = row.try_get("xact").map_err(backend)?;
        if let Some(xact) = xact
            && self.state().skipped(xact)
        {
            self.spawn_trailing();
        }
        Ok(u64::try_from(written).unwrap_or(0))
    }

    async fn take(&self, token: &LeaseToken, limit: i64, hold_ms: i64) -> Result<Taken> {
        let rows = sqlx::query(self.sql().take.clone())
            .bind(self.store.now_param())
            .bind(token.to_string())
            .bind(limit)
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
        let now_ms = now.ok_or_else(|| {
            Error::backend(BACKEND, true, "the outbox take returned no row at all")
        })?;
        Ok(Taken {
            now_ms,
            rows: taken,
        })
    }

    async fn mark_sent(&self, token: &LeaseToken, ids: &[i64]) -> Result<Vec<i64>> {
        sqlx::query_scalar(self.sql().mark_sent.clone())
            .bind(self.store.now_param())
            .bind(token.to_string())
            .bind(ids)
            .fetch_all(self.store.pool())
            .await
            .map_err(backend)
    }

    async fn mark_failed(&self, token: &LeaseToken, failed: &FailedPublish<'_>) -> Result<bool> {
        let done = sqlx::query(self.sql().mark_failed.clone())
            .bind(self.store.now_param())
            .bind(token.to_string())
            .bind(failed.id)
            .bind(failed.error)
            .bind(failed.dead)
            .bind(failed.delay_ms)
            .execute(self.store.pool())
            .await
            .map_err(backend)?;
        Ok(done.rows_affected() == 1)
    }

    async fn hand_back(&self, token: &LeaseToken, ids: &[i64]) -> Result<u64> {
        let done = sqlx::query(self.sql().hand_back.clone())
            .bind(self.store.now_param())
            .bind(token.to_string())
            .bind(ids)
            .execute(self.store.pool())
            .await
            .map_err(backend)?;
        Ok(done.rows_affected())
    }

    async fn list(&self, filter: &RowFilter<'_>) -> Result<Vec<RawOutboxRow>> {
        let rows = sqlx::query(self.sql().list.clone())
            .bind(filter.state)
            .bind(filter.destination)
            .bind(filter.after_id)
            .bind(filter.limit)
            .fetch_all(self.store.pool())
            .await
            .map_err(backend)?;
        rows.iter().map(decode).collect()
    }

    /// A `LISTEN` on [`channel`](Self::channel) over a connection of its own, as a stream
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
