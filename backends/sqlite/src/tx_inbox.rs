//! [`TxInbox`]: the transactional inbox. The synchronous handler runs inside a
//! `BEGIN IMMEDIATE` transaction on a connection to the store's file, and the key's
//! completion commits with the handler's writes.

use std::sync::{Arc, Mutex};

use dedup_core::layers::{ObserveOptions, RetryPolicy};
use dedup_core::trace::MessageTrace;
use dedup_core::{
    BoxError, DedupStore, Error, Fingerprint, Handled, InboxConfig, InboxError, Key, Lease,
    TxAttempt, TxAttempts, TxEngine,
};
use futures::future::BoxFuture;
use rusqlite::{Connection, Transaction, TransactionBehavior};

use crate::blocking::blocking;
use crate::error::{BACKEND, backend, is_conflict, is_transient};
use crate::store::SqliteStore;

/// Runs synchronous handlers inside a SQLite transaction, at most once per key.
///
/// The inbox row commits together with the handler's own writes. A duplicate delivery
/// finds the key done, so the handler's writes never happen twice.
///
/// [`handle`](Self::handle) answers the same [`Handled`] as the lease-mode
/// [`Inbox`](dedup_core::Inbox), so the acknowledgement code is the same in both modes.
/// [`TxEngine`]'s docs say how a delivery runs, and how the attempt count survives a
/// rollback and a crashed worker. They also say what it costs. Here: one lease-mode
/// claim, committed on its own, then the handler's `BEGIN IMMEDIATE` transaction, ended
/// by [`commit_in_tx`](SqliteStore::commit_in_tx). That is two write transactions, so
/// two disk flushes, per message.
///
/// The handler runs on tokio's blocking pool, never in place. It runs on a connection of
/// the inbox's own to the store's file (see [`SqliteStore::open_connection`]).
/// Connections are opened as needed and kept for the next runs. An in-memory store has
/// no such connection: every delivery then fails with [`Error::Unsupported`].
///
/// The transaction holds SQLite's one write lock from `BEGIN IMMEDIATE` to its commit,
/// and the store's write gate with it. This process's other writers wait their turn at
/// the gate, in arrival order: other deliveries, the store's own writes (this lease's
/// renewals included), purge batches. No other worker can take the key over while the
/// transaction is open.
///
/// `SQLITE_BUSY` and `SQLITE_LOCKED` are a conflict: another connection (another
/// process) held the lock past the busy timeout. They are found as a `rusqlite::Error` in
/// the handler's error's source chain, or raised by begin or commit. The handler then runs
/// again in a fresh transaction under the same lease, without using an attempt, at most
/// the [`retry`](Self::with_retry) policy's `max_retries` times. When those run out, the
/// key is released with a failure of kind `conflict`, and
/// [`InboxError::Conflict`](dedup_core::InboxError::Conflict) comes back (see
/// [`TxEngine`]). The database writes of a failed run are rolled back. The handler's other
/// side effects are not, so they must be idempotent (use [`Lease::idempotency_key`]).
/// Other errors the database asks to retry (an I/O error) run again as new attempts.
/// Handler errors marked [`Transient`](dedup_core::Transient) run again as new attempts,
/// under [`InboxConfig::handler_retry`].
///
/// There is no `handle_in` joining a transaction the caller opened, as PostgreSQL's
/// `TxInbox` has. The attempt-counting claim runs on another connection, and SQLite lets
/// one writer in at a time: it would wait for the caller's own write lock. A caller with
/// its own transaction uses [`SqliteStore::claim_in_tx`] by hand.
///
/// Messages the handler sends go through the store's outbox, in the same transaction.
/// Their ids derive from the incoming key, so a re-run writes the same ones:
/// `store.outbox().enqueue(conn, &[ConsumerOutbox::new(lease).message("/invoices", payload)?])`.
/// See [`SqliteOutbox`](crate::SqliteOutbox) and
/// [`ConsumerOutbox`](dedup_core::outbox::ConsumerOutbox). A relay publishes them after
/// the commit.
///
/// # Examples
///
/// ```
/// use dedup_core::{Handled, Key};
/// use dedup_sqlite::{SqliteStore, TxInbox};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(dir.path().join("app.db")).await?;
/// store
///     .open_connection()?
///     .execute("CREATE TABLE invoices (order_id TEXT PRIMARY KEY, fence INTEGER)", ())?;
///
/// let inbox = TxInbox::new(store);
/// let key = Key::new("billing", "order-42")?;
/// let invoice = |tx: &rusqlite::Transaction<'_>, lease: &dedup_core::Lease| {
///     tx.execute(
///         "INSERT INTO invoices (order_id, fence) VALUES (?1, ?2)",
///         ("order-42", lease.fence as i64),
///     )?;
///     Ok::<_, rusqlite::Error>(Some(b"invoiced".to_vec()))
/// };
///
/// let first = inbox.handle(&key, None, invoice).await?;
/// assert!(matches!(first, Handled::Processed { .. }));
/// // A redelivery does not insert again: the primary key would refuse it.
/// let again = inbox.handle(&key, None, invoice).await?;
/// assert!(again.is_replay());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct TxInbox {
    store: SqliteStore,
    engine: TxEngine,
    connections: Arc<Mutex<Vec<Connection>>>,
}

impl TxInbox {
    /// A transactional inbox over `store` with the default [`InboxConfig`] and
    /// [`RetryPolicy`].
    pub fn new(store: SqliteStore) -> Self {
        let shared: Arc<dyn DedupStore> = Arc::new(store.clone());
        TxInbox {
            engine: TxEngine::new(shared, InboxConfig::default()),
            store,
            connections: Arc::default(),
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
    /// `sqlite`), as [`Observed`](dedup_core::layers::Observed) gives a lease-mode inbox's
    /// store.
    pub fn observed(mut self) -> Self {
        self.engine = self.engine.observed(ObserveOptions::new(BACKEND));
        self
    }

    /// The configuration.
    pub fn config(&self) -> &InboxConfig {
        self.engine.config()
    }

    /// The store.
    pub fn store(&self) -> &SqliteStore {
        &self.store
    }

    /// Processes `key` at most once, inside a transaction. See the [type's docs](Self).
    ///
    /// `handler` gets the open transaction and the lease (fence, attempt, idempotency
    /// key). It returns the outcome stored for duplicates. It may run more than once: a
    /// retry, or a later delivery after a failure. Each run gets a fresh transaction. It
    /// must not commit or roll back the transaction itself.
    ///
    /// # Errors
    ///
    /// - [`InboxError::Handler`]: the handler failed and the failure was not stored. The
    ///   transaction was rolled back and the key released.
    /// - [`InboxError::LeaseLost`]: another worker took the key over. The transaction was
    ///   rolled back.
    /// - [`InboxError::Store`]: the store failed (claim, begin, commit), after the retries
    ///   its policy allows. An in-memory store answers [`Error::Unsupported`] here. A
    ///   panic in the handler is this too: it rolls the transaction back and does not
    ///   unwind into the caller.
    /// - [`InboxError::Outcome`]: the outcome starts with the reserved bytes. The
    ///   transaction was rolled back.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future releases the lease in the background. A transaction already
    /// running on the blocking pool still finishes: it commits or rolls back as if the
    /// future were alive. The next delivery then finds the key done, or claims it again.
    pub async fn handle<H, E>(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        handler: H,
    ) -> Result<Handled, InboxError>
    where
        H: FnMut(&Transaction<'_>, &Lease) -> Result<Option<Vec<u8>>, E> + Send + 'static,
        E: Into<BoxError>,
    {
        let mut attempts = Attempts {
            store: self.store.clone(),
            connections: Arc::clone(&self.connections),
            handler: Some(handler),
        };
        self.engine.run(key, fingerprint, &mut attempts).await
    }
}

/// One run of the handler in a transaction, on the blocking pool.
struct Attempts<H> {
    store: SqliteStore,
    connections: Arc<Mutex<Vec<Connection>>>,
    /// On the blocking thread while a run is under way.
    handler: Option<H>,
}

impl<H, E> TxAttempts for Attempts<H>
where
    H: FnMut(&Transaction<'_>, &Lease) -> Result<Option<Vec<u8>>, E> + Send + 'static,
    E: Into<BoxError>,
{
    fn attempt<'a>(&'a mut self, lease: &'a Lease) -> BoxFuture<'a, TxAttempt> {
        Box::pin(async move {
            let Some(mut handler) = self.handler.take() else {
                return TxAttempt::Store(Error::Unsupported(
                    "the handler panicked in an earlier run of this delivery",
                ));
            };
            let (store, connections, lease) = (
                self.store.clone(),
                Arc::clone(&self.connections),
                lease.clone(),
            );
            // The store's write gate, held for the whole transaction: this process's
            // writers (other deliveries, the store's write groups, purge batches) queue for
            // SQLite's one write lock in arrival order here, instead of meeting it held and
            // sleeping in the busy handler.
            let gate = store.write_gate().await;
            // The delivery's trace goes with the handler to the blocking thread, so a
            // ConsumerOutbox there follows it.
            let ran = blocking(
                false,
                MessageTrace::carry(move || {
                    let _gate = gate;
                    let ran = run_once(&store, &connections, &lease, &mut handler);
                    (handler, ran)
                }),
            )
            .await;
            match ran {
                Ok((handler, ran)) => {
                    self.handler = Some(handler);
                    ran
                }
                Err(e) => TxAttempt::Store(e),
            }
        })
    }
}

/// Take a connection (or open one), run the handler in a transaction on it, and keep the
/// connection for later runs if no transaction is left open on it.
fn run_once<H, E>(
    store: &SqliteStore,
    connections: &Mutex<Vec<Connection>>,
    lease: &Lease,
    handler: &mut H,
) -> TxAttempt
where
    H: FnMut(&Transaction<'_>, &Lease) -> Result<Option<Vec<u8>>, E>,
    E: Into<BoxError>,
{
    let pooled = connections.lock().ok().and_then(|mut pool| pool.pop());
    let mut conn = match pooled.map_or_else(|| store.open_connection(), Ok) {
        Ok(conn) => conn,
        Err(e) => return TxAttempt::Store(e),
    };
    let ran = in_transaction(store, &mut conn, lease, handler);
    if conn.is_autocommit()
        && let Ok(mut pool) = connections.lock()
    {
        pool.push(conn);
    }
    ran
}

/// Begin, run the handler, commit the lease inside, commit (a dropped transaction rolls
/// back).
fn in_transaction<H, E>(
    store: &SqliteStore,
    conn: &mut Connection,
    lease: &Lease,
    handler: &mut H,
) -> TxAttempt
where
    H: FnMut(&Transaction<'_>, &Lease) -> Result<Option<Vec<u8>>, E>,
    E: Into<BoxError>,
{
    let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => return driver_failed(e),
    };
    let outcome = match handler(&tx, lease) {
        Ok(outcome) => outcome,
        Err(e) => {
            let source: BoxError = e.into();
            if TxEngine::is_conflict(&*source, driver_conflict) {
                return TxAttempt::Conflict(source);
            }
            let retryable = TxEngine::asks_for_retry(&*source, |e| {
                e.downcast_ref::<rusqlite::Error>().map(is_transient)
            });
            return TxAttempt::HandlerFailed { source, retryable };
        }
    };
    if let Err(source) = TxEngine::check_outcome(outcome.as_deref()) {
        return TxAttempt::Outcome(source);
    }
    if let Err(e) = store.commit_in_tx(&tx, lease, outcome.as_deref()) {
        if TxEngine::is_conflict(&e, driver_conflict) {
            return TxAttempt::Conflict(e.into());
        }
        return TxAttempt::Store(e);
    }
    match tx.commit() {
        Ok(()) => TxAttempt::Committed(outcome),
        Err(e) => driver_failed(e),
    }
}

/// How a run ended whose begin or commit failed with `error`: another connection's lock
/// is a conflict (run again under the same lease), anything else the store's error.
fn driver_failed(error: rusqlite::Error) -> TxAttempt {
    let conflict = is_conflict(&error);
    let error = backend(error);
    if conflict {
        TxAttempt::Conflict(error.into())
    } else {
        TxAttempt::Store(error)
    }
}

/// Whether `error` is a driver error that is another connection's lock (`None`: not a
/// driver error).
fn driver_conflict(error: &(dyn std::error::Error + 'static)) -> Option<bool> {
    error.downcast_ref::<rusqlite::Error>().map(is_conflict)
}
