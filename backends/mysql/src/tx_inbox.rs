//! [`TxInbox`]: the transactional inbox. The handler runs inside a transaction on the
//! store's pool, and the key's completion commits with the handler's writes.

use std::sync::Arc;

use dedup_core::layers::{ObserveOptions, RetryPolicy};
use dedup_core::{
    BoxError, DedupStore, Fingerprint, Handled, InboxConfig, InboxError, Key, Lease, TxAttempt,
    TxAttempts, TxEngine,
};
use futures::future::BoxFuture;
use sqlx::MySqlConnection;

use crate::MySqlStore;
use crate::error::{BACKEND, backend};

/// Runs handlers inside a MySQL transaction, at most once per key, with the inbox row
/// committing together with the handler's own writes.
///
/// [`handle`](Self::handle) answers the same [`Handled`] as the lease-mode
/// [`Inbox`](dedup_core::Inbox), so the acknowledgement code is the same in both modes.
/// How a delivery runs, how the attempt count survives a rollback and a crashed worker,
/// and what it costs (one lease-mode claim, committed on its own, then the handler's
/// transaction ended by [`commit_in_tx`](MySqlStore::commit_in_tx): two statements and
/// two commits beside the handler's) is in [`TxEngine`]'s docs.
///
/// Errors the database asks to retry (deadlock `1213`, lock wait timeout `1205`, `NOWAIT`
/// refusals, a dropped connection), found as a `sqlx::Error` or a
/// [`dedup_core::Error`] in the handler's error's source chain or raised by the commit, run
/// the handler again in a fresh transaction, as a new attempt, under the
/// [`retry`](Self::with_retry) policy. The database writes of a failed run are rolled
/// back; the handler's other side effects (an e-mail, an HTTP call) are not, so they must
/// be idempotent (use [`Lease::idempotency_key`]).
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
#[derive(Clone, Debug)]
pub struct TxInbox {
    store: MySqlStore,
    engine: TxEngine,
}

impl TxInbox {
    /// A transactional inbox over `store` with the default [`InboxConfig`] and
    /// [`RetryPolicy`].
    pub fn new(store: MySqlStore) -> Self {
        let shared: Arc<dyn DedupStore> = Arc::new(store.clone());
        TxInbox {
            engine: TxEngine::new(shared, InboxConfig::default()),
            store,
        }
    }

    /// The same inbox with another configuration.
    pub fn with_config(mut self, config: InboxConfig) -> Self {
        self.engine = self.engine.with_config(config);
        self
    }

    /// The same inbox retrying transactions the database asked to run again under
    /// `policy`.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Self {
        self.engine = self.engine.with_retry(policy);
        self
    }

    /// The same inbox with spans and metrics for its store operations (backend label
    /// `mysql`), as [`Observed`](dedup_core::layers::Observed) gives a lease-mode
    /// inbox's store.
    pub fn observed(mut self) -> Self {
        self.engine = self.engine.observed(ObserveOptions::new(BACKEND));
        self
    }

    /// The configuration.
    pub fn config(&self) -> &InboxConfig {
        self.engine.config()
    }

    /// The store.
    pub fn store(&self) -> &MySqlStore {
        &self.store
    }

    /// Process `key` at most once, inside a transaction: see the type's docs. `handler`
    /// gets the open transaction (`&mut MySqlConnection`: run its statements on `&mut *conn`)
    /// and the lease (fence, attempt, idempotency key), and returns the outcome stored for
    /// duplicates; it may run more than once (a retry, a later delivery after a failure),
    /// each time in a fresh transaction. It must not commit or roll back the transaction
    /// itself.
    pub async fn handle<H, E>(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        handler: H,
    ) -> Result<Handled, InboxError>
    where
        H: for<'c> FnMut(
                &'c mut MySqlConnection,
                &'c Lease,
            ) -> BoxFuture<'c, Result<Option<Vec<u8>>, E>>
            + Send,
        E: Into<BoxError>,
    {
        let mut attempts = Attempts {
            store: &self.store,
            handler,
        };
        self.engine.run(key, fingerprint, &mut attempts).await
    }
}

/// One run of the handler in a transaction on the store's pool.
struct Attempts<'s, H> {
    store: &'s MySqlStore,
    handler: H,
}

impl<H, E> TxAttempts for Attempts<'_, H>
where
    H: for<'c> FnMut(
            &'c mut MySqlConnection,
            &'c Lease,
        ) -> BoxFuture<'c, Result<Option<Vec<u8>>, E>>
        + Send,
    E: Into<BoxError>,
{
    fn attempt<'a>(&'a mut self, lease: &'a Lease) -> BoxFuture<'a, TxAttempt> {
        Box::pin(async move {
            let mut tx = match self.store.pool().begin().await {
                Ok(tx) => tx,
                Err(e) => return TxAttempt::Store(backend(e)),
            };
            let ran = (self.handler)(&mut tx, lease).await.map_err(Into::into);
            let outcome = match ran {
                Ok(outcome) => outcome,
                Err(source) => {
                    let source: BoxError = source;
                    let retryable = asks_for_retry(&*source);
                    let _ = tx.rollback().await;
                    return TxAttempt::HandlerFailed { source, retryable };
                }
            };
            if let Err(source) = TxEngine::check_outcome(outcome.as_deref()) {
                let _ = tx.rollback().await;
                return TxAttempt::Outcome(source);
            }
            if let Err(e) = self
                .store
                .commit_in_tx(&mut tx, lease, outcome.as_deref())
                .await
            {
                let _ = tx.rollback().await;
                return TxAttempt::Store(e);
            }
            match tx.commit().await {
                Ok(()) => TxAttempt::Committed(outcome),
                Err(e) => TxAttempt::Store(backend(e)),
            }
        })
    }
}

/// Whether a handler's error is, or was caused by, a database error worth running the
/// transaction again for.
fn asks_for_retry(error: &(dyn std::error::Error + 'static)) -> bool {
    TxEngine::asks_for_retry(error, |e| {
        e.downcast_ref::<sqlx::Error>()
            .map(crate::error::is_retryable)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `handle`'s future can be spawned on a multi-threaded runtime.
    #[allow(dead_code)]
    fn handle_is_send(inbox: &TxInbox, key: &Key) {
        fn send<T: Send>(_: T) {}
        send(inbox.handle(key, None, |conn, _lease| {
            Box::pin(async move {
                sqlx::query("SELECT 1").execute(&mut *conn).await?;
                Ok::<_, sqlx::Error>(None)
            })
        }));
    }
}
