//! [`TxInbox`]: the transactional inbox of the sqlx backends. The handler runs inside a
//! transaction (on the store's pool, or the caller's own under a savepoint), and the key's
//! completion commits with the handler's writes. A backend supplies its claim/commit
//! statements through [`TxStore`].

use std::fmt;
use std::sync::Arc;

use std::future::Future;

use dedup_core::layers::{ObserveOptions, RetryPolicy};
use dedup_core::{
    BoxError, DedupStore, Error, Fingerprint, Handled, InboxConfig, InboxError, Key, Lease, Result,
    TxAttempt, TxAttempts, TxEngine,
};
use futures::future::BoxFuture;
use sqlx::{Database, Transaction};

use crate::error::SqlBackend;
use crate::query::SqlDb;

/// The connection a [`TxStore`]'s handlers run their statements on (`PgConnection`,
/// `MySqlConnection`).
pub type Conn<S> = <Db<S> as Database>::Connection;

/// The sqlx database of a [`TxStore`].
type Db<S> = <<S as TxStore>::Backend as SqlBackend>::Db;

/// Where [`TxInbox::handle`] gets the transaction each run of the handler runs in: the
/// store's pool by default, or yours ([`TxInbox::with_begin`]).
///
/// Implemented for a [`sqlx::Pool`] (`pool.begin()`) and for any closure returning a
/// future of a begun transaction, which may set it up before the handler runs (an
/// isolation level, `SET LOCAL` settings). Either way the transaction must be on the
/// store's database: the key's completion (`commit_in_tx`) is written in it.
pub trait Begin<DB: Database>: Send + Sync + 'static {
    /// Begin a transaction. A driver error is converted by the inbox: a conflict runs the
    /// attempt again (see [`TxEngine`]), any other is the attempt's store error.
    fn begin(&self) -> BoxFuture<'_, std::result::Result<Transaction<'static, DB>, sqlx::Error>>;
}

impl<DB: Database> Begin<DB> for sqlx::Pool<DB> {
    fn begin(&self) -> BoxFuture<'_, std::result::Result<Transaction<'static, DB>, sqlx::Error>> {
        // Boxed: sqlx's begin future (a pool acquire) is kilobytes, which the attempt's
        // future would otherwise carry and copy at every move.
        Box::pin(sqlx::Pool::begin(self))
    }
}

impl<DB, F, Fut> Begin<DB> for F
where
    DB: Database,
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<Transaction<'static, DB>, sqlx::Error>>
        + Send
        + 'static,
{
    fn begin(&self) -> BoxFuture<'_, std::result::Result<Transaction<'static, DB>, sqlx::Error>> {
        Box::pin(self())
    }
}

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
/// # Conflicts are retried, not counted
///
/// A transaction the database refuses over a conflict with a concurrent one
/// ([`SqlBackend::is_conflict`]: a deadlock, a serialization failure, a lock wait timeout),
/// raised at begin, by the handler (a `sqlx::Error` found in its error's source chain),
/// by `commit_in_tx` or by the commit, runs again in a fresh transaction under the same
/// lease: the same attempt, fence and idempotency key, no attempt used. At most
/// [`max_retries`](RetryPolicy::max_retries) times (default 3), after the policy's
/// backoff (default 50 ms doubling to 1 s, each delay drawn between half of it and all
/// of it). The cost is the runs themselves and the waits: no claim, no release. Each run
/// again counts in `dedup_handler_retries_total{reason="conflict"}`. When the retries run
/// out, the key is released with a failure of kind `conflict` kept on its record (in the
/// log line, `dedup_handler_failures_total{kind="conflict"}`, `dedup inspect`, the
/// console), and [`InboxError::Conflict`] is returned: the broker redelivers, and the
/// next delivery is the next attempt. A worker that dies during these runs leaves its
/// lease held: it expires, and the next claim is a takeover (attempt + 1). See
/// [`TxEngine`].
///
/// Other errors the database asks to retry ([`SqlBackend::is_retryable`]: a dropped
/// connection, a server restarting) run the handler again in a fresh transaction as a new
/// attempt, under the same policy. The database writes of a failed run are rolled back;
/// the handler's other side effects (an e-mail, an HTTP call) are not, so they must be
/// idempotent (use [`Lease::idempotency_key`]). Handler errors marked
/// [`Transient`](dedup_core::Transient) run again as new attempts under
/// [`InboxConfig::handler_retry`].
///
/// # What the transaction commits
///
/// Only a run that succeeded: the handler's writes and the key's completion, together
/// ([`Handled::Processed`]). Every other run is rolled back whole. A stored failure
/// ([`Handled::Failed`]) and a dead letter ([`Handled::DeadLetter`]) are written by the
/// inbox in its own short transaction on the store's pool, so no write of the handler
/// survives them. The types hold this: the handler gets the connection (`&mut Conn`),
/// not the `sqlx::Transaction`, so it has no `commit` or `rollback` to call (it must not
/// run a `COMMIT` statement either); the transaction a [`Begin`] hands over is the
/// inbox's to end.
///
/// # Your own transaction, behind a broker consumer
///
/// [`with_begin`](Self::with_begin) makes `handle` begin each run's transaction on your
/// pool, or with your closure, instead of the store's pool. With
/// `dedup_brokers::with_tx_inbox` that is the whole consumer: no glue around
/// [`handle_in`](Self::handle_in), conflicts retried as above, begin and commit errors
/// converted by the inbox, the handler's own error any `Into<BoxError>`.
pub struct TxInbox<S: TxStore> {
    store: S,
    engine: TxEngine,
    durable_claims: bool,
    begin: Option<Arc<dyn Begin<Db<S>>>>,
}

impl<S: TxStore> Clone for TxInbox<S> {
    fn clone(&self) -> Self {
        TxInbox {
            store: self.store.clone(),
            engine: self.engine.clone(),
            durable_claims: self.durable_claims,
            begin: self.begin.clone(),
        }
    }
}

impl<S: TxStore> fmt::Debug for TxInbox<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxInbox")
            .field("store", &self.store)
            .field("engine", &self.engine)
            .field("durable_claims", &self.durable_claims())
            .field(
                "begin",
                &if self.begin.is_some() {
                    "yours"
                } else {
                    "the store's pool"
                },
            )
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
            begin: None,
        }
    }

    /// The same inbox beginning each run's transaction with `begin` instead of on the
    /// store's pool: your own pool (a [`sqlx::Pool`]), or a closure that begins and sets
    /// the transaction up (an isolation level, `SET LOCAL` settings). The transaction must
    /// be on the store's database. [`handle`](Self::handle) then runs the handler in your
    /// transaction and commits it only when the run succeeded; conflicts at begin, in the
    /// handler or at the commit run again under the same lease (see the type's docs).
    ///
    /// This is [`handle_in`](Self::handle_in) for a consumer that does not already hold a
    /// transaction: the inbox begins it, ends it, and retries it.
    ///
    /// `dedup_postgres::TxInbox` and `dedup_mysql::TxInbox` show it with an isolation
    /// level set by the closure.
    pub fn with_begin(mut self, begin: impl Begin<Db<S>>) -> Self {
        self.begin = Some(Arc::new(begin));
        self
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

    /// Processes `key` at most once, inside a transaction. See the [type's docs](Self).
    ///
    /// `handler` gets the open transaction: `&mut PgConnection` or `&mut MySqlConnection`.
    /// Run its statements on `&mut *conn`. It also gets the lease (fence, attempt,
    /// idempotency key). It returns the outcome stored for duplicates.
    ///
    /// The handler may run more than once: a conflict, a retry, a later delivery after a
    /// failure. Each run gets a fresh transaction. It cannot commit or roll back the
    /// transaction itself: the inbox does. `dedup_postgres::TxInbox` and
    /// `dedup_mysql::TxInbox` show it in an example.
    ///
    /// # Errors
    ///
    /// In every case the transaction was rolled back and nothing of the run remains.
    /// - [`InboxError::Handler`]: the handler failed, and the failure was not stored. The
    ///   key was released, with the failure on its record.
    /// - [`InboxError::Conflict`]: conflicts outlasted the retries. The key was released
    ///   with a failure of kind `conflict`.
    /// - [`InboxError::LeaseLost`]: another worker took the key over.
    /// - [`InboxError::Store`]: the store failed (claim, begin, `commit_in_tx`, commit).
    ///   The key was released.
    /// - [`InboxError::Outcome`]: the outcome starts with the reserved bytes.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future releases the lease in the background. The open transaction is
    /// dropped, which rolls it back. A future dropped during the commit may have
    /// committed: the next delivery then finds the key done.
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
        let begin: &dyn Begin<Db<S>> = match &self.begin {
            Some(begin) => &**begin,
            None => self.store.pool(),
        };
        let mut attempts = Attempts {
            store: &self.store,
            begin,
            handler,
        };
        self.engine.run(key, fingerprint, &mut attempts).await
    }

    /// Processes `key` at most once, inside the caller's own transaction.
    ///
    /// Pass `&mut *tx` of a `sqlx::Transaction`. It is for a consumer that already has
    /// one open: a unit of work spanning several messages, or a transaction its framework
    /// began.
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
    /// - After [`Handled::Failed`] or [`Handled::DeadLetter`], committing or rolling back
    ///   is yours to choose. The inbox wrote the failure in its own transaction, and the
    ///   handler's writes are gone with the savepoint. Only your own writes remain.
    /// - Conflicts are not retried here: the transaction is the caller's (MySQL has rolled
    ///   it back whole, PostgreSQL has aborted it). The key is released with a failure of
    ///   kind `conflict` (this attempt used) and [`InboxError::Conflict`] comes back with
    ///   the driver error in its source chain; roll back, and run the unit of work again.
    ///   Other errors the database asks to retry come back as [`InboxError::Handler`] /
    ///   [`InboxError::Store`]. Behind a broker consumer, let the inbox own the
    ///   transaction instead ([`with_begin`](Self::with_begin) with your pool, and
    ///   [`handle`](Self::handle)): it retries conflicts without using attempts.
    /// - The attempt is still counted by a lease-mode claim committed on the store's pool
    ///   before the handler runs, so `max_attempts` and stored failures work as in
    ///   [`handle`](Self::handle); the caller's transaction must not hold a lock on this
    ///   key's inbox row when it calls (it holds none unless it touched the row itself).
    ///
    /// # Errors
    ///
    /// As [`handle`](Self::handle), except that a failed run rolls back to the savepoint
    /// only: the caller's transaction stays usable. [`InboxError::Conflict`] comes at the
    /// first conflict; roll back, and run the unit of work again.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future releases the lease in the background. The run's savepoint
    /// and its writes stay in the caller's transaction: roll the transaction back.
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
                return driver_failed::<S>(e);
            }
            let ran = (self.handler)(&mut *self.conn, lease)
                .await
                .map_err(Into::into);
            let answer = match ran {
                Err(source) => handler_failed::<S>(source),
                Ok(outcome) => match TxEngine::check_outcome(outcome.as_deref()) {
                    Err(source) => TxAttempt::Outcome(source),
                    Ok(()) => match self
                        .store
                        .commit_in_tx(&mut *self.conn, lease, outcome.as_deref())
                        .await
                    {
                        Err(e) => store_failed::<S>(e),
                        Ok(()) => {
                            return match <Db<S> as SqlDb>::run(self.conn, RELEASE_SAVEPOINT).await {
                                Ok(()) => TxAttempt::Committed(outcome),
                                Err(e) => driver_failed::<S>(e),
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

/// One run of the handler in a fresh transaction: on the store's pool, or begun by the
/// user's [`Begin`].
struct Attempts<'s, S: TxStore, H> {
    store: &'s S,
    begin: &'s dyn Begin<Db<S>>,
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
            let mut tx = match self.begin.begin().await {
                Ok(tx) => tx,
                Err(e) => return driver_failed::<S>(e),
            };
            let ran = (self.handler)(&mut *tx, lease).await.map_err(Into::into);
            let outcome = match ran {
                Ok(outcome) => outcome,
                Err(source) => {
                    let _ = tx.rollback().await;
                    return handler_failed::<S>(source);
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
                return store_failed::<S>(e);
            }
            match tx.commit().await {
                Ok(()) => TxAttempt::Committed(outcome),
                Err(e) => driver_failed::<S>(e),
            }
        })
    }
}

/// How a run whose handler failed with `source` ended: a conflict (run again under the
/// same lease), or a failure the database may ask to retry (as a new attempt) or not.
fn handler_failed<S: TxStore>(source: BoxError) -> TxAttempt {
    if TxEngine::is_conflict(&*source, driver_conflict::<S>) {
        return TxAttempt::Conflict(source);
    }
    let retryable = TxEngine::asks_for_retry(&*source, |e| {
        e.downcast_ref::<sqlx::Error>()
            .map(S::Backend::is_retryable)
    });
    TxAttempt::HandlerFailed { source, retryable }
}

/// How a run ended whose begin, savepoint or commit failed with the driver's `error`.
fn driver_failed<S: TxStore>(error: sqlx::Error) -> TxAttempt {
    let conflict = S::Backend::is_conflict(&error);
    let error = S::Backend::error(error);
    if conflict {
        TxAttempt::Conflict(error.into())
    } else {
        TxAttempt::Store(error)
    }
}

/// How a run ended whose `commit_in_tx` failed with `error`.
fn store_failed<S: TxStore>(error: Error) -> TxAttempt {
    if TxEngine::is_conflict(&error, driver_conflict::<S>) {
        TxAttempt::Conflict(error.into())
    } else {
        TxAttempt::Store(error)
    }
}

/// Whether `error` is a driver error the backend calls a conflict (`None`: not a driver
/// error).
fn driver_conflict<S: TxStore>(error: &(dyn std::error::Error + 'static)) -> Option<bool> {
    error
        .downcast_ref::<sqlx::Error>()
        .map(S::Backend::is_conflict)
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
