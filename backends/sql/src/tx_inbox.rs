//! [`TxInbox`]: the transactional inbox of the sqlx backends. The handler runs inside a
//! transaction (on the store's pool, or the caller's own under a savepoint), and the key's
//! completion commits with the handler's writes. A backend supplies its claim/commit
//! statements through [`TxStore`].

use std::fmt;
use std::sync::Arc;

use dedup_core::layers::{ObserveOptions, RetryPolicy};
use dedup_core::{
    BoxError, DedupStore, Fingerprint, Handled, InboxConfig, InboxError, Key, Lease, Result,
    TxAttempt, TxAttempts, TxEngine,
};
use futures::future::BoxFuture;
use sqlx::Database;

use crate::error::SqlBackend;
use crate::query::SqlDb;

/// The connection a [`TxStore`]'s handlers run their statements on (`PgConnection`,
/// `MySqlConnection`).
pub type Conn<S> = <Db<S> as Database>::Connection;

/// The sqlx database of a [`TxStore`].
type Db<S> = <<S as TxStore>::Backend as SqlBackend>::Db;

/// What [`TxInbox`] needs of a backend's store: its pool, the attempt-counting claim, the
/// completion inside a transaction and the driver's errors.
pub trait TxStore: Clone + fmt::Debug + Send + Sync + 'static {
    /// The backend: its database, its name, its retryable errors.
    type Backend: SqlBackend;

    /// Whether the store's lease-mode claim always waits for its own log flush (then
    /// [`TxInbox::with_durable_claims`] changes nothing).
    const CLAIMS_ALWAYS_DURABLE: bool;

    /// The store's pool; [`TxInbox::handle`] begins its transactions on it.
    fn pool(&self) -> &sqlx::Pool<<Self::Backend as SqlBackend>::Db>;

    /// The store the attempt-counting claim runs on: with `durable`, one whose claim waits
    /// for its log flush; without, the cheapest claim the backend offers.
    fn claim_store(&self, durable: bool) -> Arc<dyn DedupStore>;

    /// Complete `lease` inside the open transaction `conn` (the backend's `commit_in_tx`).
    fn commit_in_tx<'a>(
        &'a self,
        conn: &'a mut Conn<Self>,
        lease: &'a Lease,
        outcome: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<()>>;
}

/// Runs handlers inside a database transaction, at most once per key, with the inbox row
/// committing together with the handler's own writes.
///
/// [`handle`](Self::handle) answers the same [`Handled`] as the lease-mode
/// [`Inbox`](dedup_core::Inbox), so the acknowledgement code is the same in both modes.
/// How a delivery runs, how the attempt count survives a rollback and a crashed worker,
/// and what it costs (one lease-mode claim, committed on its own, then the handler's
/// transaction ended by the store's `commit_in_tx`: two statements and two commits beside
/// the handler's) is in [`TxEngine`]'s docs.
///
/// Errors the database asks to retry ([`SqlBackend::is_retryable`]: deadlocks, serialization
/// failures, lock timeouts, a dropped connection), found as a `sqlx::Error` or a
/// [`dedup_core::Error`] in the handler's error's source chain or raised by the commit, run
/// the handler again in a fresh transaction, as a new attempt, under the
/// [`retry`](Self::with_retry) policy. The database writes of a failed run are rolled
/// back; the handler's other side effects (an e-mail, an HTTP call) are not, so they must
/// be idempotent (use [`Lease::idempotency_key`]). Handler errors marked
/// [`Transient`](dedup_core::Transient) run again the same way under
/// [`InboxConfig::handler_retry`].
pub struct TxInbox<S: TxStore> {
    store: S,
    engine: TxEngine,
    durable_claims: bool,
}

impl<S: TxStore> Clone for TxInbox<S> {
    fn clone(&self) -> Self {
        TxInbox {
            store: self.store.clone(),
            engine: self.engine.clone(),
            durable_claims: self.durable_claims,
        }
    }
}

impl<S: TxStore> fmt::Debug for TxInbox<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxInbox")
            .field("store", &self.store)
            .field("engine", &self.engine)
            .field("durable_claims", &self.durable_claims())
            .finish()
    }
}

impl<S: TxStore> TxInbox<S> {
    /// A transactional inbox over `store` with the default [`InboxConfig`] and
    /// [`RetryPolicy`], its attempt-counting claim the cheapest the backend offers
    /// ([`TxStore::claim_store`]).
    pub fn new(store: S) -> Self {
        TxInbox {
            engine: TxEngine::new(store.claim_store(false), InboxConfig::default()),
            store,
            durable_claims: false,
        }
    }

    /// The same inbox with an attempt-counting claim that waits for its own log flush, as
    /// the store's lease-mode [`claim`](dedup_core::DedupStore::claim) does. Where the
    /// backend's claims always do ([`TxStore::CLAIMS_ALWAYS_DURABLE`]) nothing changes.
    pub fn with_durable_claims(mut self) -> Self {
        self.durable_claims = true;
        self.engine = self.engine.with_store(self.store.claim_store(true));
        self
    }

    /// Whether the attempt-counting claim waits for its log flush
    /// ([`with_durable_claims`](Self::with_durable_claims), or a backend whose claims
    /// always do).
    pub fn durable_claims(&self) -> bool {
        self.durable_claims || S::CLAIMS_ALWAYS_DURABLE
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
    /// [`SqlBackend::NAME`]), as [`Observed`](dedup_core::layers::Observed) gives a
    /// lease-mode inbox's store.
    pub fn observed(mut self) -> Self {
        self.engine = self.engine.observed(ObserveOptions::new(S::Backend::NAME));
        self
    }

    /// The configuration.
    pub fn config(&self) -> &InboxConfig {
        self.engine.config()
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Process `key` at most once, inside a transaction: see the type's docs. `handler`
    /// gets the open transaction (`&mut PgConnection`, `&mut MySqlConnection`: run its
    /// statements on `&mut *conn`) and the lease (fence, attempt, idempotency key), and
    /// returns the outcome stored for duplicates; it may run more than once (a retry, a
    /// later delivery after a failure), each time in a fresh transaction. It must not
    /// commit or roll back the transaction itself.
    pub async fn handle<H, E>(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        handler: H,
    ) -> std::result::Result<Handled, InboxError>
    where
        H: for<'c> FnMut(
                &'c mut Conn<S>,
                &'c Lease,
            ) -> BoxFuture<'c, std::result::Result<Option<Vec<u8>>, E>>
            + Send,
        E: Into<BoxError>,
    {
        let mut attempts = Attempts {
            store: &self.store,
            handler,
        };
        self.engine.run(key, fingerprint, &mut attempts).await
    }

    /// Process `key` at most once inside the caller's own transaction (`&mut *tx` of a
    /// `sqlx::Transaction`), for a consumer that already has one open (a unit of work
    /// spanning several messages, a transaction its framework began).
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
        conn: &mut Conn<S>,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        handler: H,
    ) -> std::result::Result<Handled, InboxError>
    where
        H: for<'c> FnMut(
                &'c mut Conn<S>,
                &'c Lease,
            ) -> BoxFuture<'c, std::result::Result<Option<Vec<u8>>, E>>
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

/// Code generic over the backend (`dedup_brokers::with_tx_inbox`) runs a handler in the
/// inbox's transaction through this: [`TxHandle::handle_tx`](dedup_core::TxHandle::handle_tx)
/// is [`TxInbox::handle`].
impl<S: TxStore> dedup_core::TxHandle for TxInbox<S>
where
    Conn<S>: Send,
{
    type Conn = Conn<S>;

    fn handle_tx<'a, H, E>(
        &'a self,
        key: &'a Key,
        fingerprint: Option<Fingerprint>,
        handler: H,
    ) -> BoxFuture<'a, std::result::Result<Handled, InboxError>>
    where
        H: for<'c> FnMut(
                &'c mut Conn<S>,
                &'c Lease,
            ) -> BoxFuture<'c, std::result::Result<Option<Vec<u8>>, E>>
            + Send
            + 'a,
        E: Into<BoxError> + Send + 'a,
    {
        Box::pin(self.handle(key, fingerprint, handler))
    }
}

/// The savepoint [`TxInbox::handle_in`] runs the handler under (standard SQL: the same on
/// PostgreSQL, MySQL and MariaDB).
pub const SAVEPOINT: &str = "SAVEPOINT dedup_tx_inbox";
/// Undoes a failed run of [`TxInbox::handle_in`].
pub const ROLLBACK_TO_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT dedup_tx_inbox";
/// Ends [`SAVEPOINT`], keeping what the run wrote.
pub const RELEASE_SAVEPOINT: &str = "RELEASE SAVEPOINT dedup_tx_inbox";

/// One run of the handler under a savepoint of the caller's transaction.
struct Joined<'s, 'c, S: TxStore, H> {
    store: &'s S,
    conn: &'c mut Conn<S>,
    handler: H,
}

impl<S, H, E> TxAttempts for Joined<'_, '_, S, H>
where
    S: TxStore,
    H: for<'c> FnMut(
            &'c mut Conn<S>,
            &'c Lease,
        ) -> BoxFuture<'c, std::result::Result<Option<Vec<u8>>, E>>
        + Send,
    E: Into<BoxError>,
{
    fn attempt<'a>(&'a mut self, lease: &'a Lease) -> BoxFuture<'a, TxAttempt> {
        Box::pin(async move {
            if let Err(e) = <Db<S> as SqlDb>::run(self.conn, SAVEPOINT).await {
                return TxAttempt::Store(S::Backend::error(e));
            }
            let ran = (self.handler)(&mut *self.conn, lease)
                .await
                .map_err(Into::into);
            let answer = match ran {
                Err(source) => {
                    let source: BoxError = source;
                    let retryable = asks_for_retry::<S>(&*source);
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
                            return match <Db<S> as SqlDb>::run(self.conn, RELEASE_SAVEPOINT).await {
                                Ok(()) => TxAttempt::Committed(outcome),
                                Err(e) => TxAttempt::Store(S::Backend::error(e)),
                            };
                        }
                    },
                },
            };
            // Undo the run, keep the caller's transaction usable.
            let _ = <Db<S> as SqlDb>::run(self.conn, ROLLBACK_TO_SAVEPOINT).await;
            let _ = <Db<S> as SqlDb>::run(self.conn, RELEASE_SAVEPOINT).await;
            answer
        })
    }
}

/// One run of the handler in a transaction on the store's pool.
struct Attempts<'s, S, H> {
    store: &'s S,
    handler: H,
}

impl<S, H, E> TxAttempts for Attempts<'_, S, H>
where
    S: TxStore,
    H: for<'c> FnMut(
            &'c mut Conn<S>,
            &'c Lease,
        ) -> BoxFuture<'c, std::result::Result<Option<Vec<u8>>, E>>
        + Send,
    E: Into<BoxError>,
{
    fn attempt<'a>(&'a mut self, lease: &'a Lease) -> BoxFuture<'a, TxAttempt> {
        Box::pin(async move {
            // Boxed: sqlx's begin future (a pool acquire) is kilobytes, which this
            // attempt's future would otherwise carry and copy at every move.
            let mut tx = match Box::pin(self.store.pool().begin()).await {
                Ok(tx) => tx,
                Err(e) => return TxAttempt::Store(S::Backend::error(e)),
            };
            let ran = (self.handler)(&mut *tx, lease).await.map_err(Into::into);
            let outcome = match ran {
                Ok(outcome) => outcome,
                Err(source) => {
                    let source: BoxError = source;
                    let retryable = asks_for_retry::<S>(&*source);
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
                .commit_in_tx(&mut *tx, lease, outcome.as_deref())
                .await
            {
                let _ = tx.rollback().await;
                return TxAttempt::Store(e);
            }
            match tx.commit().await {
                Ok(()) => TxAttempt::Committed(outcome),
                Err(e) => TxAttempt::Store(S::Backend::error(e)),
            }
        })
    }
}

/// Whether a handler's error is, or was caused by, a database error worth running the
/// transaction again for.
fn asks_for_retry<S: TxStore>(error: &(dyn std::error::Error + 'static)) -> bool {
    TxEngine::asks_for_retry(error, |e| {
        e.downcast_ref::<sqlx::Error>()
            .map(S::Backend::is_retryable)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `handle`'s future can be spawned on a multi-threaded runtime, for every backend.
    #[allow(dead_code)]
    fn handle_is_send<S: TxStore>(inbox: &TxInbox<S>, key: &Key) {
        fn send<T: Send>(_: T) {}
        send(inbox.handle(key, None, |conn, _lease| {
            Box::pin(async move {
                <Db<S> as SqlDb>::run(conn, "SELECT 1").await?;
                Ok::<_, sqlx::Error>(None)
            })
        }));
    }
}
