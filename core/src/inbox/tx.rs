//! [`TxEngine`]: the mode-independent part of the SQL backends' transactional inbox
//! (`dedup_postgres::TxInbox`, `dedup_sqlite::TxInbox`). A backend supplies only
//! [`TxAttempts`]: one run of the handler inside a transaction of its own, ended by
//! `commit_in_tx`.

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;

use super::{
    Backoff, FailurePolicy, Handled, Inbox, InboxConfig, InboxError, Mode, ReleaseOnDrop,
    Transient, handler_finished, in_delivery_span, now, retry_counted,
};
use crate::layers::metric_names as m;
use crate::layers::{ObserveOptions, Observed, RetryPolicy};
use crate::{BoxError, DedupStore, Error, Failure, Fingerprint, Key, Lease, Verdict};

/// The [`Failure::kind`] of a conflict the retries did not get past, and the `reason` of
/// its runs again in [`dedup_handler_retries_total`](m::HANDLER_RETRIES_TOTAL).
const CONFLICT: &str = "conflict";

/// How one run of the handler inside the backend's transaction ended. The backend rolls
/// the transaction back in every case but [`Committed`](TxAttempt::Committed).
#[derive(Debug)]
#[non_exhaustive]
pub enum TxAttempt {
    /// The handler succeeded and its transaction committed, holding the business writes
    /// and the key's completion (`commit_in_tx` with this outcome).
    Committed(Option<Vec<u8>>),
    /// The handler failed; the transaction was rolled back.
    HandlerFailed {
        /// The handler's error.
        source: BoxError,
        /// Whether the database asked for the transaction to be run again for a reason
        /// other than a conflict (a conflict is [`TxAttempt::Conflict`]): a dropped
        /// connection, a server restarting; the backend's [`Error::is_retryable`] for a
        /// driver error found in the error's source chain.
        retryable: bool,
    },
    /// The database refused the transaction over a conflict with a concurrent one (a
    /// deadlock, a serialization failure, a lock wait timeout, SQLite busy), raised by
    /// begin, by the handler (found in its error's source chain, see
    /// [`TxEngine::is_conflict`]), by `commit_in_tx` or by the commit itself; the
    /// transaction was rolled back. The engine runs the attempt again under the same
    /// lease, without using an attempt (see [`TxEngine`]). `source` is the handler's error,
    /// or the store's [`Error`] for the others.
    Conflict(BoxError),
    /// The store failed (begin, `commit_in_tx`, the commit itself) or answered
    /// `LeaseLost`; the transaction was rolled back.
    Store(Error),
    /// The handler's outcome starts with the reserved bytes (see
    /// [`TxEngine::check_outcome`]); the transaction was rolled back.
    Outcome(BoxError),
}

/// The backend's part of a transactional inbox: run the handler once in a fresh
/// transaction, and end it with `commit_in_tx(lease, outcome)` (fenced by the lease's
/// token) or a rollback.
pub trait TxAttempts: Send {
    /// One run under `lease`: begin, run the handler with the transaction and the lease,
    /// check the outcome with [`TxEngine::check_outcome`], `commit_in_tx`, commit.
    fn attempt<'a>(&'a mut self, lease: &'a Lease) -> BoxFuture<'a, TxAttempt>;
}

/// The engine of the transactional inbox: claims the key in lease mode, runs the
/// backend's [`TxAttempts`] under a renewed lease, and settles the key as the lease-mode
/// [`Inbox`] does (same [`Handled`], same stored failures and dead letters, same spans
/// and metrics with `mode = "tx"`).
///
/// Per delivery:
/// 1. **Claim in lease mode**, its own statement, committed at once. This is what counts
///    the attempt and survives everything after it: a rollback, a crashed worker (its lease
///    expires and the next claim is a takeover, attempt + 1), a dropped future (the lease
///    is released in the background, the next claim is attempt + 1). A duplicate gets the
///    stored outcome (or stored failure, or dead letter) without running the handler; a
///    live lease elsewhere is [`Handled::Busy`]; past
///    [`max_attempts`](InboxConfig::max_attempts) the key is completed as dead-lettered in
///    lease mode, without a transaction.
/// 2. **Run the attempt**: the backend begins a transaction, runs the handler with it,
///    completes the key inside it with `commit_in_tx(lease, outcome)` (fenced by the
///    lease's token: a worker whose lease was taken over gets `LeaseLost` and rolls back)
///    and commits. Meanwhile the lease is renewed as in lease mode.
/// 3. **A conflict is run again under the same lease.** When the database refuses the
///    transaction over a conflict with a concurrent one ([`TxAttempt::Conflict`]: a
///    deadlock, a serialization failure, a lock wait timeout, SQLite busy; at begin, in the
///    handler, at `commit_in_tx` or at the commit), the engine waits the
///    [`retry`](Self::retry) policy's backoff (doubling, each delay drawn between half of
///    it and all of it, so workers that deadlocked together do not retry together) and
///    runs the attempt again in a fresh transaction, up to
///    [`max_retries`](RetryPolicy::max_retries) times. No attempt is used: the lease is
///    kept (renewed throughout, runs and backoffs alike), so the handler sees the same
///    attempt, fence and idempotency key, and `commit_in_tx` stays fenced by the lease's
///    token. A conflict is not the message's fault, and counting one against
///    `max_attempts` would dead-letter valid messages under load. Each run again is
///    counted in [`dedup_handler_retries_total`](m::HANDLER_RETRIES_TOTAL) with `reason =
///    "conflict"`. When the retries run out, the failure is kept on the record with kind
///    `conflict`, the lease released, and [`InboxError::Conflict`] returned (never a
///    stored failure, whatever the [`FailurePolicy`]): the delivery ends as a failed
///    attempt does, and the broker's redelivery is the next attempt. A worker that dies
///    during these runs leaves its lease held: it expires, and the next claim is a
///    takeover, attempt + 1, as after any crash.
/// 4. **On any other failure** the transaction is rolled back (no business row, no
///    completion) and:
///    - another error the database asks to retry (a dropped connection, a server
///      restarting) runs again after the [`retry`](Self::retry) policy's backoff, in a
///      fresh transaction and as a new attempt (the lease is held, renewed, through the
///      backoff, then released and claimed again, so each run counts toward
///      `max_attempts`, and another worker may take it instead: then this call answers
///      what that claim answered); these runs and the conflicts' share the policy's
///      `max_retries`;
///    - a handler error marked [`Transient`] runs again the same way under
///      [`InboxConfig::handler_retry`] (its own count and delays; see
///      [`HandlerRetry`](super::HandlerRetry)); used up, it is given back as
///      [`InboxError::Handler`] and never stored as the key's result;
///    - any other handler error, with [`FailurePolicy::Retry`], releases the lease and
///      returns [`InboxError::Handler`]; with [`FailurePolicy::Store`], commits the failure
///      as the key's result in lease mode and returns [`Handled::Failed`];
///    - `LeaseLost` returns [`InboxError::LeaseLost`]; other store errors release the lease
///      and return [`InboxError::Store`].
///
/// Cost against a hand-written `claim_in_tx`: one more statement and one more commit per
/// message (the lease-mode claim), plus a renewal per [`renew_every`](InboxConfig) of
/// handler time; a failure adds a release (or a lease-mode commit), a retry as a new
/// attempt a release and a claim; a conflict's run again adds nothing but the run and its
/// backoff. A backend may commit that claim without waiting for its log flush when the
/// handler's durable commit follows and flushes past it (PostgreSQL's `TxInbox` does, and
/// documents what a server crash can then lose).
pub struct TxEngine {
    inbox: Inbox<dyn DedupStore>,
    retry: RetryPolicy,
    observe: Option<ObserveOptions>,
}

impl std::fmt::Debug for TxEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxEngine")
            .field("config", self.inbox.config())
            .field("retry", &self.retry)
            .field("observe", &self.observe)
            .finish_non_exhaustive()
    }
}

impl Clone for TxEngine {
    fn clone(&self) -> Self {
        TxEngine {
            inbox: self.inbox.clone(),
            retry: self.retry,
            observe: self.observe.clone(),
        }
    }
}

impl TxEngine {
    /// An engine whose lease-mode operations (claim, renew, release, the commit of a stored
    /// failure or dead letter) go to `store`, with `config` and the default retry policy.
    pub fn new(store: Arc<dyn DedupStore>, config: InboxConfig) -> Self {
        TxEngine {
            inbox: Inbox::from_arc(store, config),
            retry: RetryPolicy::default(),
            observe: None,
        }
    }

    /// The same engine with its lease-mode operations wrapped in
    /// [`Observed`](crate::layers::Observed) with `options`, and each commit inside a
    /// transaction counted in [`dedup_commits_total`](m::COMMITS_TOTAL) under the same
    /// `backend` label once the transaction committed.
    pub fn observed(mut self, options: ObserveOptions) -> Self {
        let store: Arc<dyn DedupStore> = Arc::clone(self.inbox.store());
        let observed = Observed::new(store, options.clone());
        let observed: Arc<dyn DedupStore> = Arc::new(observed);
        self.inbox = Inbox {
            store: observed,
            ..self.inbox.clone()
        };
        self.observe = Some(options);
        self
    }

    /// The same engine (configuration, retry policy, observation) with its lease-mode
    /// operations going to `store` instead: a backend's other handle on the same records
    /// (PostgreSQL's `TxInbox` switches between claims that commit asynchronously and
    /// durably this way).
    pub fn with_store(mut self, store: Arc<dyn DedupStore>) -> Self {
        let store: Arc<dyn DedupStore> = match &self.observe {
            Some(options) => Arc::new(Observed::new(store, options.clone())),
            None => store,
        };
        self.inbox = Inbox {
            store,
            ..self.inbox.clone()
        };
        self
    }

    /// The same engine with another configuration.
    pub fn with_config(mut self, config: InboxConfig) -> Self {
        self.inbox = self.inbox.with_config(config);
        self
    }

    /// The same engine retrying transactions the database asked to run again under
    /// `policy` ([`RetryPolicy::NEVER`]: never): conflicts under the same lease, other
    /// retryable errors as new attempts (see the type's docs).
    pub fn with_retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &InboxConfig {
        self.inbox.config()
    }

    /// The retry policy for transactions the database asked to run again.
    pub fn retry(&self) -> &RetryPolicy {
        &self.retry
    }

    /// Refuse a handler's outcome that starts with the bytes reserved for the inbox's own
    /// verdicts (`\0dedup:`), as the lease-mode [`Inbox`] does. Backends call it before
    /// `commit_in_tx`.
    pub fn check_outcome(outcome: Option<&[u8]>) -> Result<(), BoxError> {
        if Verdict::is_reserved(outcome) {
            Err("a handler's outcome may not start with the reserved bytes \\0dedup:".into())
        } else {
            Ok(())
        }
    }

    /// Whether a handler's `error` is, or was caused by, an error the database asks to run
    /// the transaction again for: the first error in its source chain that is a
    /// [`dedup_core::Error`](Error) ([`Error::is_retryable`]) or that `driver` classifies
    /// (`Some(retryable)` for the backend's driver error type, `None` for others) decides.
    pub fn asks_for_retry(
        error: &(dyn std::error::Error + 'static),
        driver: impl Fn(&(dyn std::error::Error + 'static)) -> Option<bool>,
    ) -> bool {
        let mut current = Some(error);
        while let Some(e) = current {
            if let Some(ours) = e.downcast_ref::<Error>() {
                return ours.is_retryable();
            }
            if let Some(retryable) = driver(e) {
                return retryable;
            }
            current = e.source();
        }
        false
    }

    /// Whether a handler's `error` is, or was caused by, a conflict the database refused
    /// the transaction for (a deadlock, a serialization failure, a lock wait timeout,
    /// SQLite busy): the first error in its source chain that `driver` classifies
    /// (`Some(conflict)` for the backend's driver error type, `None` for others) decides.
    /// A [`dedup_core::Error`](Error) in the chain does not decide: its source (the
    /// driver's error, for a backend's) is read on.
    pub fn is_conflict(
        error: &(dyn std::error::Error + 'static),
        driver: impl Fn(&(dyn std::error::Error + 'static)) -> Option<bool>,
    ) -> bool {
        let mut current = Some(error);
        while let Some(e) = current {
            if let Some(conflict) = driver(e) {
                return conflict;
            }
            current = e.source();
        }
        false
    }

    /// Handle one delivery of `key`: see the type's docs.
    pub async fn run(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        attempts: &mut dyn TxAttempts,
    ) -> Result<Handled, InboxError> {
        in_delivery_span(key, Mode::Tx, |span| async move {
            self.settle(key, fingerprint, attempts, &span).await
        })
        .await
    }

    /// Claim in lease mode; `Ok(lease)` to run, or the delivery's answer.
    async fn claim(
        &self,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
    ) -> Result<Lease, Result<Handled, InboxError>> {
        self.inbox.acquire(key, fingerprint, Ok, Mode::Tx).await
    }

    async fn settle(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        attempts: &mut dyn TxAttempts,
        span: &tracing::Span,
    ) -> Result<Handled, InboxError> {
        let store = self.inbox.store();
        let mut lease = match self.claim(key, fingerprint.as_ref()).await {
            Ok(lease) => lease,
            Err(answer) => return answer,
        };
        // Runs again so far: after errors the database asked to retry (conflicts under
        // the same lease, others as new attempts), and after `Transient` handler errors
        // (each counted against its own policy).
        let mut retries = 0;
        let mut transient_retries = 0;
        let mut backoff = self.retry.initial_backoff;
        loop {
            span.record("attempt", lease.attempt);
            if let Some(max) = self.config().max_attempts
                && lease.attempt > max
            {
                return self.inbox.dead_letter(&lease, Mode::Tx).await;
            }
            let mut guard = ReleaseOnDrop {
                store: Arc::clone(store),
                lease: Some(lease.clone()),
            };
            let first_started = Instant::now();
            // One renewal for every run of this attempt and the backoffs between them.
            let (ran, started) = tokio::select! {
                biased;
                lost = self.inbox.keep_renewed(&lease) => {
                    guard.disarm();
                    handler_finished(key, Mode::Tx, "lease_lost", first_started);
                    return Err(InboxError::LeaseLost { key: lost.key });
                }
                ran = self.run_through_conflicts(&lease, attempts, &mut retries) => ran,
            };
            guard.disarm();
            // The failed attempt to run again (below), kept on the record by the release.
            let failure = match ran {
                TxAttempt::Committed(outcome) => {
                    handler_finished(key, Mode::Tx, "ok", started);
                    self.count_commit(key);
                    return Ok(Handled::Processed { outcome, lease });
                }
                TxAttempt::Conflict(source) => {
                    // Every run met a conflict, and the retries ran out.
                    handler_finished(key, Mode::Tx, "conflict", started);
                    let failure = self.failure(CONFLICT, &*source, &lease);
                    self.inbox.release_failed(&lease, &failure, Mode::Tx).await;
                    return Err(InboxError::Conflict {
                        key: key.clone(),
                        failure: Box::new(failure),
                        source,
                    });
                }
                TxAttempt::HandlerFailed { source, retryable } => {
                    handler_finished(key, Mode::Tx, "error", started);
                    let failure = self.inbox.failure_of(&*source, &lease);
                    if retryable && retries < self.retry.max_retries {
                        failure
                    } else if !retryable
                        && self
                            .config()
                            .handler_retry
                            .again(transient_retries, &*source)
                    {
                        transient_retries += 1;
                        retry_counted(key, Mode::Tx, "transient");
                        let delay = self.config().handler_retry.delay(transient_retries);
                        self.inbox
                            .pause_then_release(&lease, delay, &failure, Mode::Tx)
                            .await?;
                        lease = match self.claim(key, fingerprint.as_ref()).await {
                            Ok(lease) => lease,
                            Err(answer) => return answer,
                        };
                        continue;
                    } else if !retryable
                        && self.config().failures == FailurePolicy::Store
                        && !Transient::is_in(&*source)
                    {
                        return self.inbox.store_failure(&lease, failure, Mode::Tx).await;
                    } else {
                        self.inbox.release_failed(&lease, &failure, Mode::Tx).await;
                        return Err(InboxError::Handler {
                            key: key.clone(),
                            failure: Box::new(failure),
                            source,
                        });
                    }
                }
                TxAttempt::Store(e) if e.is_lease_lost() => {
                    handler_finished(key, Mode::Tx, "lease_lost", started);
                    self.count_lease_lost(key);
                    return Err(InboxError::LeaseLost { key: key.clone() });
                }
                TxAttempt::Store(e) => {
                    handler_finished(key, Mode::Tx, "error", started);
                    let failure = self.failure("store", &e, &lease);
                    if e.is_retryable() && retries < self.retry.max_retries {
                        failure
                    } else {
                        self.inbox.release_failed(&lease, &failure, Mode::Tx).await;
                        return Err(InboxError::Store(e));
                    }
                }
                TxAttempt::Outcome(source) => {
                    handler_finished(key, Mode::Tx, "ok", started);
                    let failure = self.failure("outcome", &*source, &lease);
                    self.inbox.release_failed(&lease, &failure, Mode::Tx).await;
                    return Err(InboxError::Outcome {
                        key: key.clone(),
                        source,
                    });
                }
            };
            // The database asked for another run for a reason other than a conflict: a
            // new attempt, in a fresh transaction.
            retries += 1;
            retry_counted(key, Mode::Tx, "database");
            self.inbox
                .pause_then_release(&lease, backoff, &failure, Mode::Tx)
                .await?;
            backoff = (backoff * 2).min(self.retry.max_backoff);
            lease = match self.claim(key, fingerprint.as_ref()).await {
                Ok(lease) => lease,
                Err(answer) => return answer,
            };
        }
    }

    /// Run the attempt under `lease`, and again under the same lease after each conflict
    /// while the [`retry`](Self::retry) policy allows (`retries`: runs again so far, for
    /// this delivery); the last run's end and when that run started.
    async fn run_through_conflicts(
        &self,
        lease: &Lease,
        attempts: &mut dyn TxAttempts,
        retries: &mut u32,
    ) -> (TxAttempt, Instant) {
        loop {
            let started = Instant::now();
            match attempts.attempt(lease).await {
                TxAttempt::Conflict(source) if *retries < self.retry.max_retries => {
                    handler_finished(&lease.key, Mode::Tx, "conflict", started);
                    *retries += 1;
                    retry_counted(&lease.key, Mode::Tx, CONFLICT);
                    let delay = self.conflict_delay(*retries);
                    tracing::debug!(
                        consumer = lease.key.consumer(),
                        message_id = lease.key.message_id(),
                        attempt = lease.attempt,
                        retry = *retries,
                        cause = %crate::error_chain(&*source),
                        "dedup inbox: the database refused the transaction (a conflict); it runs again under the same lease after {delay:?}"
                    );
                    tokio::time::sleep(delay).await;
                }
                ran => return (ran, started),
            }
        }
    }

    /// The delay before a conflict's run again number `retry` (1 for the first): the
    /// policy's backoff, doubling, each drawn between half of it and all of it.
    fn conflict_delay(&self, retry: u32) -> std::time::Duration {
        Backoff::Exponential {
            initial: self.retry.initial_backoff,
            max: self.retry.max_backoff,
            jitter: true,
        }
        .delay(retry)
    }

    /// The failure `error` of `kind` caused at `lease`'s attempt, now, on this worker.
    fn failure(
        &self,
        kind: &str,
        error: &(dyn std::error::Error + 'static),
        lease: &Lease,
    ) -> Failure {
        Failure::of_error(
            kind,
            error,
            lease.attempt,
            now(),
            self.inbox.worker.as_deref(),
        )
    }

    /// The same engine naming its worker `name` in the failures it keeps and logs (see
    /// [`Inbox::with_worker`]).
    pub fn with_worker(mut self, name: impl Into<String>) -> Self {
        self.inbox = self.inbox.with_worker(name);
        self
    }

    /// Count a commit made inside a committed transaction, as `Observed` counts a commit.
    fn count_commit(&self, key: &Key) {
        if let Some(options) = &self.observe {
            metrics::counter!(m::COMMITS_TOTAL, "backend" => options.backend, "consumer" => key.consumer().to_owned())
                .increment(1);
        }
    }

    /// Count a `commit_in_tx` answered `LeaseLost`, as `Observed` counts a lost commit.
    fn count_lease_lost(&self, key: &Key) {
        if let Some(options) = &self.observe {
            metrics::counter!(m::LEASE_LOST_TOTAL, "backend" => options.backend, "consumer" => key.consumer().to_owned(), "op" => "commit_in_tx")
                .increment(1);
        }
    }
}
