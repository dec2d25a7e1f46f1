//! [`OutboxDialect`]: what a sqlx backend supplies to [`SqlOutbox`](super::SqlOutbox), its
//! statements and its row decoding, one method per outbox operation.

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::backend::outbox::RawOutboxRow;
use dedup_core::outbox::OutboxMessage;
use dedup_core::{LeaseToken, Result};
use futures::stream::BoxStream;
use sqlx::{Database, Pool, SqlStr};
use tokio::sync::OnceCell;

use super::row::{StateCounts, decode_state_counts};
use crate::error::SqlBackend;
use crate::purge::retention_ms;
use crate::query::{Param, SqlDb};
use crate::store::SqlStore;

/// The database of a dialect's backend.
pub type Db<D> = <<D as OutboxDialect>::Backend as SqlBackend>::Db;

/// The connection of a dialect's database (`PgConnection`, `MySqlConnection`): `enqueue`
/// runs on `&mut *tx` of the caller's transaction.
pub type Conn<D> = <<<D as OutboxDialect>::Backend as SqlBackend>::Db as Database>::Connection;

/// The outbox table as a store knows it: its name as the statements splice it in, and
/// whether it is known to be current. A store builds one with its statements; its clones
/// share it, so a store that migrated marks it and a check runs at most once per store.
#[derive(Debug)]
pub struct OutboxTableState {
    name: String,
    shared: SharedStatements,
    ready: OnceCell<()>,
}

impl OutboxTableState {
    /// The table quoted as spliced into the statements (`"schema"."t"`, `` `t` ``), with
    /// the dialect's [`SharedStatements`] for it, not yet known current.
    pub fn new(name: String, shared: SharedStatements) -> Self {
        OutboxTableState {
            name,
            shared,
            ready: OnceCell::new(),
        }
    }

    /// The table, quoted.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The statements [`OutboxDialect`]'s provided methods run on this table.
    pub fn shared(&self) -> &SharedStatements {
        &self.shared
    }

    /// The table was just migrated: no check needed.
    pub fn migrated(&self) {
        let _ = self.ready.set(());
    }

    /// Set once the table is known to be current.
    pub(crate) fn ready(&self) -> &OnceCell<()> {
        &self.ready
    }
}

/// The outbox statements whose parameters are the same on every server, rendered by the
/// dialect for its table and kept in its [`OutboxTableState`]. [`OutboxDialect`]'s
/// provided methods run them; every one reads
/// the clock from its first parameter, the store's "now" (`NULL`: the server's).
#[derive(Debug)]
pub struct SharedStatements {
    /// An operator's retry of one row (pending, due now, attempts reset). Parameters:
    /// now, the row's id.
    pub retry: SqlStr,
    /// The counts by state ([`StateCounts`]: columns `now_ms`, and per state `state`, `n`,
    /// `oldest`). Parameter: now.
    pub stats: SqlStr,
    /// The counts by destination and state (as `stats`, with a `destination` column).
    /// Parameter: now.
    pub stats_by_destination: SqlStr,
    /// One purge batch: rows sent before now minus the retention, oldest first.
    /// Parameters: now, the retention in ms, the batch's size.
    pub purge_batch: SqlStr,
}

/// A failed publish of one held row, as [`OutboxDialect::mark_failed`] records it.
#[derive(Clone, Copy, Debug)]
pub struct FailedPublish<'a> {
    /// The row's id.
    pub id: i64,
    /// The publish error's text, kept as the row's last error.
    pub error: &'a str,
    /// Dead (never published again) rather than pending again.
    pub dead: bool,
    /// When pending again: due this many ms from the store's "now".
    pub delay_ms: i64,
}

/// The rows an operator's listing reads ([`OutboxDialect::list`]).
#[derive(Clone, Copy, Debug)]
pub struct RowFilter<'a> {
    /// Only rows in this state (as stored), or every state.
    pub state: Option<&'static str>,
    /// Only rows for this destination, or every one.
    pub destination: Option<&'a str>,
    /// Only rows with an id above this.
    pub after_id: i64,
    /// At most this many rows.
    pub limit: i64,
}

/// Rows a take put under a fresh hold, with the store's "now" when it took them.
#[derive(Debug)]
pub struct Taken {
    /// The store's clock at the take (ms since the Unix epoch): the hold runs out at this
    /// plus the hold's length.
    pub now_ms: i64,
    /// The rows now held, their `state` and `attempts` as the take left them, in any order.
    pub rows: Vec<RawOutboxRow>,
}

/// One server's outbox statements over its own connection pool and clock. Each method is
/// one operation on the outbox table and returns what the statements found, undecided:
/// [`SqlOutbox`](super::SqlOutbox) checks the inputs, checks the table once, encodes and
/// decodes headers, orders the results and turns them into what
/// [`OutboxStore`](dedup_core::outbox::OutboxStore) promises.
///
/// Every method that marks rows is fenced by the hold: it changes a row only while it is
/// `held` by `token` and its hold has not run out by the store's clock.
#[async_trait]
pub trait OutboxDialect: Send + Sync + Debug + 'static {
    /// The backend: its database, its name in errors, its retryable errors.
    type Backend: SqlBackend;

    /// The store whose outbox this is.
    type Store: SqlStore<Backend = Self::Backend>;

    /// The store (its pool, its clock).
    fn store(&self) -> &Self::Store;

    /// The store's pool (the table check and the relay's statements run on it).
    fn pool(&self) -> &Pool<Db<Self>> {
        self.store().store_pool()
    }

    /// The store's "now" as the statements bind it: the injected clock's reading in ms, or
    /// `None` (`NULL`: the server's clock).
    fn now_param(&self) -> Option<i64> {
        self.store().store_config().now_param()
    }

    /// The outbox table's name, shared statements and readiness, shared by the store's
    /// clones.
    fn table(&self) -> &OutboxTableState;

    /// Check on `conn`, writing nothing, that the outbox table is at this build's schema
    /// version.
    async fn check_table(&self, conn: &mut Conn<Self>) -> Result<()>;

    /// Insert `messages` (non-empty; `headers[i]` is the JSON text of message `i`'s headers)
    /// on the caller's connection, in the caller's order, due after each message's delay
    /// from the store's "now". A message id already in the table writes nothing. Returns
    /// how many rows were new.
    async fn insert(
        &self,
        conn: &mut Conn<Self>,
        messages: &[OutboxMessage],
        headers: &[String],
    ) -> Result<u64>;

    /// Take at most `limit` due rows (pending and due, or held with a hold that ran out),
    /// the earliest due first, none while an earlier row of its ordering key is pending or
    /// held, none another take is holding at this moment: each becomes `held` by `token`
    /// for `hold_ms`, its attempts one more.
    async fn take(&self, token: &LeaseToken, limit: i64, hold_ms: i64) -> Result<Taken>;

    /// Mark the rows of `ids` still held by `token` sent; returns the ids marked (any order).
    async fn mark_sent(&self, token: &LeaseToken, ids: &[i64]) -> Result<Vec<i64>>;

    /// Record a failed publish of a row held by `token` ([`FailedPublish`]). Whether the
    /// row was still held.
    async fn mark_failed(&self, token: &LeaseToken, failed: &FailedPublish<'_>) -> Result<bool>;

    /// Hand the rows of `ids` held by `token` back: pending, due now, the take's attempt
    /// undone. How many were handed back.
    async fn hand_back(&self, token: &LeaseToken, ids: &[i64]) -> Result<u64>;

    /// An operator's retry of a dead (or pending) row: pending, due now, attempts reset.
    /// Whether the row was changed.
    async fn retry(&self, id: i64) -> Result<bool> {
        let sql = self.table().shared().retry.clone();
        let params = [Param::Int(self.now_param()), Param::Int(Some(id))];
        let done = Db::<Self>::execute(self.pool(), sql, &params)
            .await
            .map_err(Self::Backend::error)?;
        Ok(Self::Backend::rows_affected(&done) == 1)
    }

    /// The table's counts by state, and "now".
    async fn count_states(&self) -> Result<StateCounts> {
        counts(self, self.table().shared().stats.clone(), false).await
    }

    /// The table's counts by destination and state (each count's `destination` set), and
    /// "now": one aggregate statement.
    async fn count_destinations(&self) -> Result<StateCounts> {
        counts(
            self,
            self.table().shared().stats_by_destination.clone(),
            true,
        )
        .await
    }

    /// The rows `filter` selects, by id.
    async fn list(&self, filter: &RowFilter<'_>) -> Result<Vec<RawOutboxRow>>;

    /// Delete at most `limit` rows sent more than `retention` ago, oldest first; how many.
    async fn purge_sent(&self, retention: Duration, limit: i64) -> Result<u64> {
        let sql = self.table().shared().purge_batch.clone();
        let params = [
            Param::Int(self.now_param()),
            Param::Int(Some(retention_ms(retention))),
            Param::Int(Some(limit)),
        ];
        let done = Db::<Self>::execute(self.pool(), sql, &params)
            .await
            .map_err(Self::Backend::error)?;
        Ok(Self::Backend::rows_affected(&done))
    }

    /// A stream with one item per committed enqueue (or `None`: the relay polls).
    async fn wakeups(&self) -> Result<Option<BoxStream<'static, Result<()>>>> {
        Ok(None)
    }
}

/// Run `dialect`'s counting statement `sql` (its one parameter: now), its rows decoded per
/// destination or not.
async fn counts<D: OutboxDialect + ?Sized>(
    dialect: &D,
    sql: SqlStr,
    by_destination: bool,
) -> Result<StateCounts> {
    let params = [Param::Int(dialect.now_param())];
    let rows = Db::<D>::fetch_all(dialect.pool(), sql, &params)
        .await
        .map_err(D::Backend::error)?;
    decode_state_counts::<Db<D>>(&rows, by_destination, D::Backend::error)
}
