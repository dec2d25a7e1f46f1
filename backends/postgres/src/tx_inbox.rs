//! [`TxInbox`]: the transactional inbox. The handler runs inside a transaction on the
//! store's pool, and the key's completion commits with the handler's writes.

use std::sync::Arc;

use dedup_core::layers::{ObserveOptions, RetryPolicy};
use dedup_core::{
    BoxError, DedupStore, Fingerprint, Handled, InboxConfig, InboxError, Key, Lease, TxAttempt,
    TxAttempts, TxEngine,
};
use futures::future::BoxFuture;
use sqlx::PgConnection;

use crate::PostgresStore;
use crate::error::{BACKEND, backend};

/// Runs handlers inside a PostgreSQL transaction, at most once per key, with the inbox row
/// committing together with the handler's own writes.
///
/// [`handle`](Self::handle) answers the same [`Handled`] as the lease-mode
/// [`Inbox`](dedup_core::Inbox), so the acknowledgement code is the same in both modes.
/// How a delivery runs, how the attempt count survives a rollback and a crashed worker,
/// and what it costs (one lease-mode claim, committed on its own, then the handler's
/// transaction ended by [`commit_in_tx`](PostgresStore::commit_in_tx): two statements and
/// two commits beside the handler's) is in [`TxEngine`]'s docs.
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
/// [`with_durable_claims`](Self::with_durable_claims) makes the claim wait for its own
/// flush instead, for a second durable commit per message.
///
/// Errors the database asks to retry (serialization failure `40001`, deadlock `40P01`,
/// lock timeout, a dropped connection), found as a `sqlx::Error` or a
/// [`dedup_core::Error`] in the handler's error's source chain or raised by the commit, run
/// the handler again in a fresh transaction, as a new attempt, under the
/// [`retry`](Self::with_retry) policy. The database writes of a failed run are rolled
/// back; the handler's other side effects (an e-mail, an HTTP call) are not, so they must
/// be idempotent (use [`Lease::idempotency_key`]). Handler errors marked
/// [`Transient`](dedup_core::Transient) run again the same way under
/// [`InboxConfig::handler_retry`].
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
#[derive(Clone, Debug)]
pub struct TxInbox {
    store: PostgresStore,
    engine: TxEngine,
    durable_claims: bool,
}

impl TxInbox {
    /// A transactional inbox over `store` with the default [`InboxConfig`] and
    /// [`RetryPolicy`].
    pub fn new(store: PostgresStore) -> Self {
        // The attempt-counting claim commits asynchronously: see the type's docs.
        let shared: Arc<dyn DedupStore> = Arc::new(store.lazy_claims());
        TxInbox {
            engine: TxEngine::new(shared, InboxConfig::default()),
            store,
            durable_claims: false,
        }
    }

    /// The same inbox with an attempt-counting claim that waits for its own log flush,
    /// as [`PostgresStore::claim`](dedup_core::DedupStore::claim) does: a server crash or a
    /// failover to an asynchronous replica then loses no attempt count, fence or lease
    /// either, at the cost of a second durable commit per message (see the type's docs for
    /// what the default, asynchronous claim can lose). For a poison message that crashes
    /// the database server itself, or a fence that must never be handed out twice.
    pub fn with_durable_claims(mut self) -> Self {
        self.durable_claims = true;
        let store: Arc<dyn DedupStore> = Arc::new(self.store.clone());
        self.engine = self.engine.with_store(store);
        self
    }

    /// Whether the attempt-counting claim waits for its log flush
    /// ([`with_durable_claims`](Self::with_durable_claims)).
    pub fn durable_claims(&self) -> bool {
        self.durable_claims
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
    /// `postgres`), as [`Observed`](dedup_core::layers::Observed) gives a lease-mode
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
    pub fn store(&self) -> &PostgresStore {
        &self.store
    }

    /// Process `key` at most once, inside a transaction: see the type's docs. `handler`
    /// gets the open transaction (`&mut PgConnection`: run its statements on `&mut *conn`)
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
                &'c mut PgConnection,
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

impl TxInbox {
    /// Process `key` at most once inside the caller's own transaction (`&mut *tx` of a
    /// `sqlx::Transaction<'_, Postgres>`), for a consumer that already has one open (a
    /// unit of work spanning several messages, a transaction its framework began).
    ///
    /// As [`handle`](Self::handle), with these differences:
    /// - The handler runs under a savepoint in the caller's transaction, and the key is
    ///   completed in it (`commit_in_tx`); [`Handled::Processed`] means "written in your
    ///   transaction": the completion becomes visible when the caller commits. If the
    ///   caller rolls back instead, nothing of the run remains but the attempt, and the key
    ///   answers [`Handled::Busy`] until the lease runs out, then runs again as the next
    ///   attempt.
    /// - A failed run rolls back to the savepoint, so the caller's own earlier writes stay
    ///   and its transaction stays usable; [`Transient`](dedup_core::Transient) errors run
    ///   again under [`InboxConfig::handler_retry`] in a fresh savepoint.
    /// - Errors the database asks to retry are not retried here (the transaction is the
    ///   caller's to run again): they come back as [`InboxError::Handler`] /
    ///   [`InboxError::Store`] with the driver error as the source.
    /// - The attempt is still counted by a lease-mode claim committed on the store's pool
    ///   before the handler runs, so `max_attempts` and stored failures work as in
    ///   [`handle`](Self::handle); the caller's transaction must not hold a lock on this
    ///   key's inbox row when it calls (it holds none unless it touched the row itself).
    pub async fn handle_in<H, E>(
        &self,
        conn: &mut PgConnection,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        handler: H,
    ) -> Result<Handled, InboxError>
    where
        H: for<'c> FnMut(
                &'c mut PgConnection,
                &'c Lease,
            ) -> BoxFuture<'c, Result<Option<Vec<u8>>, E>>
            + Send,
        E: Into<BoxError>,
    {
        let mut attempts = Joined {
            store: &self.store,
            conn,
            handler,
        };
        self.engine
            .clone()
            .with_retry(RetryPolicy::NEVER)
            .run(key, fingerprint, &mut attempts)
            .await
    }
}

/// One run of the handler under a savepoint of the caller's transaction.
struct Joined<'s, 'c, H> {
    store: &'s PostgresStore,
    conn: &'c mut PgConnection,
    handler: H,
}

const SAVEPOINT: &str = "SAVEPOINT dedup_tx_inbox";
const ROLLBACK_TO_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT dedup_tx_inbox";
const RELEASE_SAVEPOINT: &str = "RELEASE SAVEPOINT dedup_tx_inbox";

impl<H, E> TxAttempts for Joined<'_, '_, H>
where
    H: for<'c> FnMut(&'c mut PgConnection, &'c Lease) -> BoxFuture<'c, Result<Option<Vec<u8>>, E>>
        + Send,
    E: Into<BoxError>,
{
    fn attempt<'a>(&'a mut self, lease: &'a Lease) -> BoxFuture<'a, TxAttempt> {
        Box::pin(async move {
            if let Err(e) = sqlx::query(SAVEPOINT).execute(&mut *self.conn).await {
                return TxAttempt::Store(backend(e));
            }
            let ran = (self.handler)(&mut *self.conn, lease)
                .await
                .map_err(Into::into);
            let answer = match ran {
                Err(source) => {
                    let source: BoxError = source;
                    let retryable = asks_for_retry(&*source);
                    TxAttempt::HandlerFailed { source, retryable }
                }
                Ok(outcome) => match TxEngine::check_outcome(outcome.as_deref()) {
                    Err(source) => TxAttempt::Outcome(source),
                    Ok(()) => match self
                        .store
                        .commit_in_tx(&mut *self.conn, lease, outcome.as_deref())
                        .await
                    {
                        Err(e) => TxAttempt::Store(e),
                        Ok(()) => {
                            return match sqlx::query(RELEASE_SAVEPOINT)
                                .execute(&mut *self.conn)
                                .await
                            {
                                Ok(_) => TxAttempt::Committed(outcome),
                                Err(e) => TxAttempt::Store(backend(e)),
                            };
                        }
                    },
                },
            };
            // Undo the run, keep the caller's transaction usable.
            let _ = sqlx::query(ROLLBACK_TO_SAVEPOINT)
                .execute(&mut *self.conn)
                .await;
            let _ = sqlx::query(RELEASE_SAVEPOINT)
                .execute(&mut *self.conn)
                .await;
            answer
        })
    }
}

/// One run of the handler in a transaction on the store's pool.
struct Attempts<'s, H> {
    store: &'s PostgresStore,
    handler: H,
}

impl<H, E> TxAttempts for Attempts<'_, H>
where
    H: for<'c> FnMut(&'c mut PgConnection, &'c Lease) -> BoxFuture<'c, Result<Option<Vec<u8>>, E>>
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

impl dedup_core::TxHandle for TxInbox {
    type Conn = PgConnection;

    fn handle_tx<'a, H, E>(
        &'a self,
        key: &'a Key,
        fingerprint: Option<Fingerprint>,
        handler: H,
    ) -> BoxFuture<'a, Result<Handled, InboxError>>
    where
        H: for<'c> FnMut(
                &'c mut PgConnection,
                &'c Lease,
            ) -> BoxFuture<'c, Result<Option<Vec<u8>>, E>>
            + Send
            + 'a,
        E: Into<BoxError> + Send + 'a,
    {
        Box::pin(self.handle(key, fingerprint, handler))
    }
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
