//! [`TxInbox`]: the transactional inbox on PostgreSQL: [`dedup_sql::TxInbox`] over a
//! [`PostgresStore`], whose attempt-counting claim commits asynchronously.

use std::sync::Arc;

use dedup_core::{DedupStore, Lease, Result};
use dedup_sql::TxStore;
use futures::future::BoxFuture;
use sqlx::{PgConnection, PgPool};

use crate::PostgresStore;
use crate::error::Backend;

/// Runs handlers inside a PostgreSQL transaction, at most once per key, with the inbox row
/// committing together with the handler's own writes.
///
/// [`handle`](dedup_sql::TxInbox::handle) (and [`handle_in`](dedup_sql::TxInbox::handle_in),
/// inside the caller's own transaction) answers the same [`Handled`](dedup_core::Handled) as the lease-mode
/// [`Inbox`](dedup_core::Inbox), so the acknowledgement code is the same in both modes.
/// How a delivery runs, how the attempt count survives a rollback and a crashed worker,
/// and what it costs (one lease-mode claim, committed on its own, then the handler's
/// transaction ended by [`commit_in_tx`](PostgresStore::commit_in_tx): two statements and
/// two commits beside the handler's) is in [`TxEngine`](dedup_core::TxEngine)'s docs.
///
/// **The attempt-counting claim commits asynchronously** (`synchronous_commit = off` for
/// that claim's own transaction, set inside its one statement): it does not wait for the
/// server's log flush, so a message pays one durable commit, the handler's. Nothing is lost
/// by it while the server runs: the claim is visible to every other worker as soon as it
/// returns. The handler's transaction commits durably after it, and the server flushes its
/// log in order, so once the handler's commit returns (or the commit of a stored failure
/// or a dead letter, or any later durable commit on the server) the claim is durable too.
/// What a server crash (or a failover to an asynchronous replica) can lose is therefore
/// exactly the claims not yet covered by such a flush: the attempt count, fence and lease
/// of a run whose transaction had not committed. After the restart the key is as before
/// that claim, so the next delivery runs as the same attempt number with the same fence
/// (a handler's side effects outside the database, keyed by
/// [`Lease::idempotency_key`], then see that run again). A completion, stored outcome,
/// stored failure or dead letter is never lost: each commits durably.
/// [`with_durable_claims`](dedup_sql::TxInbox::with_durable_claims) makes the claim wait for its own
/// flush instead, for a second durable commit per message.
///
/// A conflict (serialization failure `40001`, deadlock `40P01`, lock timeout `55P03`),
/// found as a `sqlx::Error` in the handler's error's source chain or raised by begin or the
/// commit, runs the handler again in a fresh transaction under the same lease, without
/// using an attempt, at most [`max_retries`](dedup_core::layers::RetryPolicy::max_retries)
/// times; then the key is released with a failure of kind `conflict` and
/// [`InboxError::Conflict`](dedup_core::InboxError::Conflict) comes back (see
/// [`dedup_sql::TxInbox`]). A dropped connection runs it again as a new attempt. The
/// database writes of a failed run are rolled back; the handler's other side effects (an
/// e-mail, an HTTP call) are not, so they must be idempotent (use
/// [`Lease::idempotency_key`](dedup_core::Lease::idempotency_key)). Handler errors marked
/// [`Transient`](dedup_core::Transient) run again as new attempts under
/// [`InboxConfig::handler_retry`](dedup_core::InboxConfig::handler_retry).
///
/// # Examples
///
/// [`with_begin`](dedup_sql::TxInbox::with_begin) runs the handler in your own
/// transactions (your pool, or a closure that begins them), committed only when it
/// succeeded and retried the same way on a conflict:
///
/// ```no_run
/// # async fn demo(store: dedup_postgres::PostgresStore, pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use dedup_core::Key;
/// let serializable = move || {
///     let pool = pool.clone();
///     async move {
///         let mut tx = pool.begin().await?;
///         sqlx::query("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
///             .execute(&mut *tx)
///             .await?;
///         Ok(tx)
///     }
/// };
/// let inbox = dedup_postgres::TxInbox::new(store).with_begin(serializable);
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
/// Messages the handler sends go through the store's outbox in the same transaction, with
/// ids derived from the incoming key so a re-run writes the same ones:
/// `store.outbox().enqueue(conn, &[ConsumerOutbox::new(lease).message("/invoices", payload)?])`
/// (see [`PostgresOutbox`](crate::PostgresOutbox) and
/// [`ConsumerOutbox`](dedup_core::outbox::ConsumerOutbox)); a relay publishes them after
/// the commit.
///
/// ```no_run
/// # async fn demo(store: dedup_postgres::PostgresStore) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use dedup_core::{Handled, Key};
/// use dedup_postgres::TxInbox;
/// let inbox = TxInbox::new(store);
/// let key = Key::new("billing", "order-42")?;
/// let handled = inbox
///     .handle(&key, None, |conn, lease| {
///         Box::pin(async move {
///             sqlx::query("INSERT INTO invoices (order_id, fence) VALUES ($1, $2)")
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
pub type TxInbox = dedup_sql::TxInbox<PostgresStore>;

impl TxStore for PostgresStore {
    type Backend = Backend;
    // The default claim commits asynchronously: see [`TxInbox`]'s docs.
    const CLAIMS_ALWAYS_DURABLE: bool = false;

    fn pool(&self) -> &PgPool {
        PostgresStore::pool(self)
    }

    fn claim_store(&self, durable: bool) -> Arc<dyn DedupStore> {
        if durable {
            Arc::new(self.clone())
        } else {
            Arc::new(self.lazy_claims())
        }
    }

    fn commit_in_tx<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        lease: &'a Lease,
        outcome: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(PostgresStore::commit_in_tx(self, conn, lease, outcome))
    }
}
