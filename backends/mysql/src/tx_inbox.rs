//! [`TxInbox`]: the transactional inbox on MySQL / MariaDB: [`dedup_sql::TxInbox`] over a
//! [`MySqlStore`].

use std::sync::Arc;

use dedup_core::{DedupStore, Lease, Result};
use dedup_sql::TxStore;
use futures::future::BoxFuture;
use sqlx::{MySqlConnection, MySqlPool};

use crate::MySqlStore;
use crate::error::Backend;

/// Runs handlers inside a MySQL transaction, at most once per key, with the inbox row
/// committing together with the handler's own writes.
///
/// [`handle`](dedup_sql::TxInbox::handle) (and [`handle_in`](dedup_sql::TxInbox::handle_in),
/// inside the caller's own transaction, under a savepoint) answers the same [`Handled`](dedup_core::Handled) as the lease-mode
/// [`Inbox`](dedup_core::Inbox), so the acknowledgement code is the same in both modes.
/// How a delivery runs, how the attempt count survives a rollback and a crashed worker,
/// and what it costs (one lease-mode claim, committed on its own, then the handler's
/// transaction ended by [`commit_in_tx`](MySqlStore::commit_in_tx): two statements and
/// two commits beside the handler's) is in [`TxEngine`](dedup_core::TxEngine)'s docs.
///
/// A conflict (deadlock `1213`, lock wait timeout `1205`, `NOWAIT` refusals), found as a
/// `sqlx::Error` in the handler's error's source chain or raised by begin or the commit,
/// runs the handler again in a fresh transaction under the same lease, without using an
/// attempt, at most [`max_retries`](dedup_core::layers::RetryPolicy::max_retries) times;
/// then the key is released with a failure of kind `conflict` and
/// [`InboxError::Conflict`](dedup_core::InboxError::Conflict) comes back (see
/// [`dedup_sql::TxInbox`]). A dropped connection runs it again as a new attempt. The
/// database writes of a failed run are rolled back; the handler's other side effects (an
/// e-mail, an HTTP call) are not, so they must be idempotent (use
/// [`Lease::idempotency_key`](dedup_core::Lease::idempotency_key)).
///
/// # Examples
///
/// [`with_begin`](dedup_sql::TxInbox::with_begin) runs the handler in your own
/// transactions (your pool, or a closure that begins them), committed only when it
/// succeeded and retried the same way on a conflict:
///
/// ```no_run
/// # async fn demo(store: dedup_mysql::MySqlStore, pool: sqlx::MySqlPool) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use dedup_core::Key;
/// let read_committed = move || {
///     let pool = pool.clone();
///     async move {
///         pool.begin_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
///             .await
///     }
/// };
/// let inbox = dedup_mysql::TxInbox::new(store).with_begin(read_committed);
/// let key = Key::new("shipping", "order-42")?;
/// inbox
///     .handle(&key, None, |conn, _lease| {
///         Box::pin(async move {
///             sqlx::query("UPDATE stock SET reserved = reserved + 1 WHERE sku = 'A'")
///                 .execute(&mut *conn)
///                 .await?;
///             Ok::<_, sqlx::Error>(None)
///         })
///     })
///     .await?;
/// # Ok(()) }
/// ```
///
/// The attempt-counting claim is the store's own lease-mode claim, which waits for its
/// log flush: [`durable_claims`](dedup_sql::TxInbox::durable_claims) is always `true`.
///
/// Messages the handler sends go through the store's outbox in the same transaction, with
/// ids derived from the incoming key so a re-run writes the same ones:
/// `store.outbox().enqueue(conn, &[ConsumerOutbox::new(lease).message("/invoices", payload)?])`
/// (see [`MySqlOutbox`](crate::MySqlOutbox) and
/// [`ConsumerOutbox`](dedup_core::outbox::ConsumerOutbox)); a relay publishes them after
/// the commit.
///
/// ```no_run
/// # async fn demo(store: dedup_mysql::MySqlStore) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use dedup_core::{Handled, Key};
/// use dedup_mysql::TxInbox;
/// let inbox = TxInbox::new(store);
/// let key = Key::new("billing", "order-42")?;
/// let handled = inbox
///     .handle(&key, None, |conn, lease| {
///         Box::pin(async move {
///             sqlx::query("INSERT INTO invoices (order_id, fence) VALUES (?, ?)")
///                 .bind("order-42")
///                 .bind(lease.fence as i64)
///                 .execute(&mut *conn)
///                 .await?;
///             Ok::<_, sqlx::Error>(Some(b"invoiced".to_vec()))
///         })
///     })
///     .await?;
/// assert!(handled.is_settled());
/// # Ok(()) }
/// ```
pub type TxInbox = dedup_sql::TxInbox<MySqlStore>;

impl TxStore for MySqlStore {
    type Backend = Backend;
    const CLAIMS_ALWAYS_DURABLE: bool = true;

    fn pool(&self) -> &MySqlPool {
        MySqlStore::pool(self)
    }

    fn claim_store(&self, _durable: bool) -> Arc<dyn DedupStore> {
        Arc::new(self.clone())
    }

    fn commit_in_tx<'a>(
        &'a self,
        conn: &'a mut MySqlConnection,
        lease: &'a Lease,
        outcome: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(MySqlStore::commit_in_tx(self, conn, lease, outcome))
    }
}
