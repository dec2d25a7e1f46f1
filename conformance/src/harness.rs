//! What a backend provides to run the suite: a factory of isolated stores.

use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use async_trait::async_trait;
use dedup_core::layers::RetryPolicy;
use dedup_core::{
    DedupStore, Fingerprint, Handled, InboxConfig, InboxError, Key, Lease, ManualClock, Result,
    Timestamp, TxClaim,
};
use futures::future::BoxFuture;

/// Everything a clause hands the factory when it opens a store.
#[derive(Clone, Debug)]
pub struct TestContext {
    /// A name unique to this test run and clause (`[a-z0-9_]`, at most 40 bytes, starts with a
    /// letter): use it as the table name, schema name or key prefix so parallel tests never
    /// see each other's records.
    pub namespace: String,
    /// The clock the store must use for lease arithmetic (instead of the server's), so the
    /// clause controls expiry exactly.
    pub clock: Arc<ManualClock>,
}

impl TestContext {
    /// A fresh context for `clause`: a unique namespace and a manual clock standing at the
    /// current wall-clock time (so stored timestamps look sane to a server).
    pub fn new(clause: &str) -> Self {
        let short: String = clause
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .take(20)
            .collect::<String>()
            .to_ascii_lowercase();
        let unique = uuid::Uuid::new_v4().simple().to_string();
        TestContext {
            namespace: format!("t_{short}_{}", &unique[..16]),
            clock: Arc::new(ManualClock::starting_now()),
        }
    }

    /// The clock's current time.
    pub fn now(&self) -> Timestamp {
        dedup_core::Clock::now(&*self.clock)
    }
}

/// Builds stores for the suite. Implemented once per backend, in its `tests/conformance.rs`.
#[async_trait]
pub trait StoreFactory: Send + Sync + 'static {
    /// The store under test.
    type Store: DedupStore + 'static;

    /// Open the store for `ctx.namespace`, taking "now" from `ctx.clock`.
    ///
    /// Opening twice with the same context must yield a second, independent handle (its own
    /// connections) on the same records, as a second process would see them; for a
    /// persistent store, a handle opened after the first was dropped must see what the first
    /// committed. Panics on failure (this is test code).
    async fn open(&self, ctx: &TestContext) -> Self::Store;

    /// Whether the backend can run here. A server-backed factory returns false when its
    /// server URL is not set, which skips the clause with a message, except under
    /// `DEDUP_TEST_STRICT=1`, where [`server_url`] panics instead. Defaults to true.
    fn available(&self) -> bool {
        true
    }

    /// Try to open a store for `ctx` whose table, schema or key prefix is `name` instead of
    /// one derived from `ctx.namespace`, and return what the store's constructor returned.
    /// The clause `unsafe_names_are_rejected` passes names no backend may accept (empty,
    /// spaces, braces, glob characters, non-ASCII, over 100 bytes) and requires
    /// `Err(InvalidInput)`. Defaults to `None`: the store takes no such name (the clause
    /// then says so and checks nothing).
    async fn open_named(&self, ctx: &TestContext, name: &str) -> Option<Result<Self::Store>> {
        let _ = (ctx, name);
        None
    }

    /// How many random histories
    /// [`model_based_histories_match_memory_store`](crate::model::model_based_histories_match_memory_store)
    /// runs on this factory's stores. Defaults to `None`: proptest's count
    /// (`PROPTEST_CASES`, 256 when unset). A wrapper whose stores are also run in full
    /// without it (as [`KeptCounts`](crate::clauses::KeptCounts) is) may ask fewer.
    fn model_cases(&self) -> Option<u32> {
        None
    }
}

/// How a transaction opened by a test's factory ends ([`TransactionalFactory`], an
/// [`OutboxProducer`](crate::outbox::OutboxProducer)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxEnd {
    /// Commit it: its rows become visible.
    Commit,
    /// Roll it back: nothing it wrote remains.
    Rollback,
}

/// The transactional extension of a SQL backend, driven by the transactional clauses.
///
/// Each method runs one transaction of the backend's own type; the clauses cannot name that
/// type, so the backend's test implements these few steps with it. A "business row" is a
/// row the factory writes into a table of its own (created per namespace) to stand for the
/// caller's business data: it must commit or roll back with the inbox row.
#[async_trait]
pub trait TransactionalFactory: StoreFactory {
    /// Begin a transaction; claim `key` inside it (with `fingerprint`); if the claim is
    /// `TxClaim::Claimed`, insert the business row `(key, label)`; then run one more trivial
    /// statement in the same transaction (proving it is still usable after a duplicate);
    /// then await `hold` (the clause uses it to keep the transaction open); then end it as
    /// `end` says. Returns the claim's result (an error from the claim ends the transaction
    /// with a rollback and is returned).
    async fn claim_in_transaction(
        &self,
        store: &Self::Store,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
        label: &str,
        hold: BoxFuture<'static, ()>,
        end: TxEnd,
    ) -> Result<TxClaim>;

    /// Begin a transaction; insert the business row `(lease.key, label)`; commit `lease` with
    /// `outcome` inside the same transaction; end it as `end` says. Returns the commit's
    /// result (`Err(LeaseLost)` when the token no longer holds the key; the transaction is
    /// then rolled back).
    async fn commit_in_transaction(
        &self,
        store: &Self::Store,
        lease: &Lease,
        outcome: Option<&[u8]>,
        label: &str,
        end: TxEnd,
    ) -> Result<()>;

    /// The labels of the committed business rows written for `key`, in insertion order.
    async fn business_rows(&self, store: &Self::Store, key: &Key) -> Vec<String>;
}

/// What the handler run by [`TxInboxFactory::tx_handle`] does each time it runs. Every run
/// first counts itself in [`TxJob::runs`] and writes the business row `row@<attempt>`
/// (the lease's attempt) in its transaction.
#[derive(Debug)]
#[non_exhaustive]
pub enum TxWork {
    /// Return this outcome.
    Succeed(Option<Vec<u8>>),
    /// Fail with an error whose message is this text (not a database error).
    Fail(String),
    /// Send on `started`, then wait for `proceed`: return no outcome when it is sent, fail
    /// when its sender is dropped. The clause drops the handling future meanwhile (a worker
    /// killed mid-handler).
    Hang {
        /// Told once the business row is written.
        started: tokio::sync::oneshot::Sender<()>,
        /// What the handler waits for.
        proceed: tokio::sync::oneshot::Receiver<()>,
    },
    /// On the first run, after the business row, meet a real conflict the database asks to
    /// retry (PostgreSQL: a serialization failure, `40001`, from a write racing a
    /// concurrent transaction's; SQLite: `SQLITE_BUSY`), and fail with that driver error;
    /// on later runs return this outcome.
    ConflictOnce(Option<Vec<u8>>),
}

/// One delivery for [`TxInboxFactory::tx_handle`].
#[derive(Debug)]
pub struct TxJob {
    /// The inbox's configuration.
    pub config: InboxConfig,
    /// Its retry policy for transactions the database refused.
    pub retry: RetryPolicy,
    /// What the handler does.
    pub work: TxWork,
    /// Counts the handler's runs.
    pub runs: Arc<AtomicU32>,
}

/// The transactional inbox of a SQL backend (`TxInbox`), driven by the `tx_inbox_*`
/// clauses.
#[async_trait]
pub trait TxInboxFactory: TransactionalFactory {
    /// Handle `key` once through the backend's transactional inbox over `store`, set up as
    /// `job` says, with a handler that does `job.work` inside the inbox's transaction (see
    /// [`TxWork`]). Returns what `handle` returned.
    async fn tx_handle(
        &self,
        store: &Self::Store,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        job: TxJob,
    ) -> std::result::Result<Handled, InboxError>;
}

/// The URL in environment variable `var`, for server-backed factories.
///
/// Missing or empty: `None` (the factory reports itself unavailable and clauses skip),
/// except with `DEDUP_TEST_STRICT=1`, where a missing server is a test failure (panic).
pub fn server_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Some(v),
        _ if strict() => panic!(
            "{var} is not set and DEDUP_TEST_STRICT=1: start the servers with scripts/test.sh \
             (or eval \"$(scripts/services.sh env)\")"
        ),
        _ => None,
    }
}

/// Whether `DEDUP_TEST_STRICT=1` is set.
pub fn strict() -> bool {
    std::env::var("DEDUP_TEST_STRICT").is_ok_and(|v| v == "1")
}

/// Called by the generated tests: true when the clause should run; prints why not otherwise.
#[doc(hidden)]
pub fn should_run<F: StoreFactory>(factory: &F, clause: &str) -> bool {
    report_available(factory.available(), clause)
}

/// `ok`, after printing why `clause` is skipped when it is not.
pub(crate) fn report_available(ok: bool, clause: &str) -> bool {
    if !ok {
        eprintln!(
            "SKIPPED {clause}: backend unavailable (set its DEDUP_* URL, see scripts/test.sh)"
        );
    }
    ok
}
