//! [`Inbox`]: run a handler at most once per key, under a lease that renews itself, with
//! an attempt limit for poison messages and stored failures.

mod config;
mod error;
mod failing;
mod handled;
#[cfg(feature = "serde")]
mod json;
mod report;
mod retry;
mod tx;
mod tx_handle;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;

pub use config::{DuplicateLog, FailurePolicy, InboxConfig};
pub use error::InboxError;
use failing::now;
pub use handled::Handled;
pub use retry::{Backoff, HandlerRetry, Transient};
pub use tx::{TxAttempt, TxAttempts, TxEngine};
pub use tx_handle::TxHandle;

use crate::purger::Background;
use report::{
    Mode, attempt_failed, dead_letter_counted, handled_name, handler_finished, in_delivery_span,
    log_duplicate, retry_counted,
};

use crate::{
    BoxError, Claim, ClaimOptions, DedupStore, Failure, Fingerprint, Key, Lease, Timestamp, Verdict,
};

/// Turns a handler's value into outcome bytes.
type Encode<T> = fn(&T) -> Result<Option<Vec<u8>>, BoxError>;
/// Turns stored outcome bytes back into a handler's value.
type Decode<T> = fn(Option<Vec<u8>>) -> Result<T, BoxError>;

/// Runs a handler at most once per key.
///
/// An `Inbox` wraps a [`DedupStore`]. It is where most users start. Call
/// [`handle`](Self::handle) once per delivery, with the delivery's [`Key`].
///
/// This is lease mode: the claim commits at once, and a lease guards the run. The SQL
/// backends' `TxInbox` is the transactional mode: the claim commits with your writes.
///
/// For each delivery it claims the key:
/// - Acquired: it runs the handler. The lease renews itself in the background.
/// - The handler succeeded: it commits the handler's outcome.
/// - The handler failed: it releases the key, keeping the failure on the record.
///   With [`FailurePolicy::Store`] it commits the failure instead.
/// - The handler panicked: it releases the key, then the panic continues.
/// - Already completed: a duplicate. It answers the stored outcome.
/// - Another worker holds a live lease: it answers busy.
/// - Past [`InboxConfig::max_attempts`]: a dead letter. The handler does not run.
///
/// The answer is a [`Handled`]: map it onto the broker's ack.
///
/// A handler error marked [`Transient`] can run the handler again, in process. Each run
/// is a new attempt. [`InboxConfig::handler_retry`] sets how (off by default).
///
/// Clones share the store and the retention purge. Cloning is cheap.
///
/// # Store errors and database conflicts
///
/// The inbox's own store errors never use an attempt. A claim that fails took no lease.
/// A commit that fails with a retryable error is tried again in place, under
/// [`InboxConfig::commit_retry`] (commit is retry-safe). A renewal that fails is tried
/// again at the next tick.
///
/// A database conflict inside the handler (a deadlock in a transaction of its own) is
/// the handler's error. The inbox does not own that transaction, so it cannot run it
/// again: the run counts as a failed attempt, of kind `handler` (or `transient`, if the
/// handler marks it [`Transient`]). Let the handler retry its own transaction. Or use a
/// SQL backend's `TxInbox`: it runs a conflicted transaction again without using an
/// attempt (see [`TxEngine`]).
///
/// # Observability
///
/// Each call runs in a `dedup_inbox` span. Its fields are `consumer`, `attempt` and
/// `result`. The message id is not among them: the store's spans carry it when allowed.
/// The inbox records
/// [`dedup_handler_duration_seconds`](crate::layers::metric_names::HANDLER_DURATION_SECONDS).
/// It counts dead letters, stored failures and runs again
/// ([`dedup_handler_retries_total`](crate::layers::metric_names::HANDLER_RETRIES_TOTAL)).
/// [`InboxConfig::log_duplicates`] logs each suppressed duplicate. Wrap the store in
/// [`Observed`](crate::layers::Observed) to count its operations too.
///
/// # Examples
///
/// ```
/// use dedup_core::{Handled, Inbox, Key, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let inbox = Inbox::new(MemoryStore::new());
/// let key = Key::new("billing", "order-42")?;
/// let charge = |_lease| async { Ok::<_, std::io::Error>(Some(b"charged".to_vec())) };
///
/// // The first delivery runs the handler.
/// let first = inbox.handle(&key, None, charge).await?;
/// assert!(matches!(first, Handled::Processed { .. }));
///
/// // A redelivery gets the stored outcome back.
/// let again = inbox.handle(&key, None, charge).await?;
/// assert!(again.is_replay());
/// assert!(matches!(again, Handled::Duplicate { outcome: Some(o), .. } if o == b"charged"));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Inbox<S: ?Sized> {
    config: InboxConfig,
    store: Arc<S>,
    retention: Arc<Background>,
    worker: Option<Arc<str>>,
}

impl<S: ?Sized> Clone for Inbox<S> {
    fn clone(&self) -> Self {
        Inbox {
            config: self.config.clone(),
            store: Arc::clone(&self.store),
            retention: Arc::clone(&self.retention),
            worker: self.worker.clone(),
        }
    }
}

impl<S: DedupStore + 'static> Inbox<S> {
    /// An inbox over `store` with the default [`InboxConfig`].
    ///
    /// # Examples
    ///
    /// ```
    /// use dedup_core::{Inbox, MemoryStore};
    ///
    /// let inbox = Inbox::new(MemoryStore::new());
    /// assert_eq!(inbox.config().max_attempts, None);
    /// ```
    pub fn new(store: S) -> Self {
        Self::from_arc(Arc::new(store), InboxConfig::default())
    }
}

impl<S: DedupStore + ?Sized + 'static> Inbox<S> {
    /// An inbox over a shared store with `config`.
    ///
    /// Use it for an `Arc<dyn DedupStore>`, such as the one `dedup::open` returns.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use dedup_core::{DedupStore, Inbox, InboxConfig, MemoryStore};
    ///
    /// let store: Arc<dyn DedupStore> = Arc::new(MemoryStore::new());
    /// let config = InboxConfig {
    ///     max_attempts: Some(5),
    ///     ..InboxConfig::default()
    /// };
    /// let inbox = Inbox::from_arc(store, config);
    /// assert_eq!(inbox.config().max_attempts, Some(5));
    /// ```
    pub fn from_arc(store: Arc<S>, config: InboxConfig) -> Self {
        Inbox {
            config,
            store,
            retention: Arc::default(),
            worker: None,
        }
    }

    /// The same inbox, naming its worker `name`.
    ///
    /// The name appears in the [`Failure`]s kept on the records and in failure log lines.
    /// Use a host or pod name. It is 1 to 128 bytes; a longer one is cut.
    pub fn with_worker(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        self.worker = (!name.is_empty()).then(|| Arc::from(name.as_str()));
        self
    }

    /// The same inbox with another configuration.
    ///
    /// It gets its own retention purge.
    pub fn with_config(self, config: InboxConfig) -> Self {
        Self::from_arc(self.store, config)
    }

    /// The configuration.
    pub fn config(&self) -> &InboxConfig {
        &self.config
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// Processes `key` at most once.
    ///
    /// `handler` gets the [`Lease`]. Pass its fence or idempotency key to downstream
    /// systems. The handler returns the outcome to store for duplicates. The outcome is at
    /// most [`MAX_OUTCOME_LEN`](crate::MAX_OUTCOME_LEN) bytes. It may not start with the
    /// reserved bytes `\0dedup:`. The handler's error may be any type that converts into
    /// `Box<dyn Error + Send + Sync>`: `std` errors, `anyhow::Error`, `String`, `&str`.
    ///
    /// The handler is an `FnMut` that builds a fresh future per run. It may run again
    /// within this call after an error marked [`Transient`] (see
    /// [`InboxConfig::handler_retry`], off by default). Clone what each run needs inside
    /// the closure: `|lease| charge(order.clone(), lease)`.
    ///
    /// See the [type's docs](Inbox) for what each answer means.
    ///
    /// # Errors
    ///
    /// Never acknowledge the message on an error: let the broker deliver it again.
    ///
    /// - [`InboxError::Handler`]: the handler failed (and [`FailurePolicy::Retry`] is in
    ///   force). The key was released, with the failure kept on its record.
    /// - [`InboxError::LeaseLost`]: another worker took the key over while the handler ran.
    ///   The handler's future was dropped at its next await point.
    /// - [`InboxError::Store`]: the claim failed, or the commit failed after its retries.
    ///   An outcome the store refuses (too long) is this too.
    /// - [`InboxError::Outcome`]: the outcome starts with the reserved bytes. Nothing was
    ///   committed and the key was released.
    ///
    /// # Panics
    ///
    /// If the handler panics, the key is released (the failure kept on its record). Then
    /// the panic continues out of this call.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is safe, but not free:
    /// - Dropped while the handler runs or commits: the lease is released in a background
    ///   task on the current runtime. The next delivery can claim the key at once. The
    ///   handler's side effects so far stay.
    /// - Dropped during the claim: the claim may have taken effect. The key then waits for
    ///   its lease to expire ([`InboxConfig::lease`], 30 s by default).
    ///
    /// # Examples
    ///
    /// ```
    /// use dedup_core::{Handled, Inbox, InboxError, Key, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let inbox = Inbox::new(MemoryStore::new());
    /// let key = Key::new("billing", "order-7")?;
    ///
    /// // A failing handler: the key is released for the next delivery.
    /// let failed = inbox
    ///     .handle(&key, None, |_lease| async { Err::<Option<Vec<u8>>, _>("card declined") })
    ///     .await;
    /// assert!(matches!(failed, Err(InboxError::Handler { .. })));
    ///
    /// // The next delivery runs the handler again, as attempt 2.
    /// let handled = inbox
    ///     .handle(&key, None, |lease| async move {
    ///         assert_eq!(lease.attempt, 2);
    ///         Ok::<_, std::io::Error>(None)
    ///     })
    ///     .await?;
    /// match handled {
    ///     Handled::Processed { .. } | Handled::Duplicate { .. } => { /* ack */ }
    ///     Handled::Busy { .. } => { /* nack: redeliver later */ }
    ///     Handled::Failed { .. } | Handled::DeadLetter { .. } => { /* dead-letter queue */ }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn handle<F, Fut, E>(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        handler: F,
    ) -> Result<Handled, InboxError>
    where
        F: FnMut(Lease) -> Fut,
        Fut: Future<Output = Result<Option<Vec<u8>>, E>>,
        E: Into<BoxError>,
    {
        let retry = self.config.handler_retry;
        self.run(key, fingerprint, handler, &retry, |o| Ok(o.clone()), Ok)
            .await
    }

    /// The work of [`handle`](Self::handle) for outcomes of type `T`.
    async fn run<T, F, Fut, E>(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        mut handler: F,
        retry: &HandlerRetry,
        encode: Encode<T>,
        decode: Decode<T>,
    ) -> Result<Handled<T>, InboxError>
    where
        F: FnMut(Lease) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        in_delivery_span(key, Mode::Lease, |span| async move {
            let mut retries = 0;
            loop {
                let lease = match self
                    .acquire(key, fingerprint.as_ref(), decode, Mode::Lease)
                    .await
                {
                    Ok(lease) => lease,
                    Err(answer) => return answer,
                };
                span.record("attempt", lease.attempt);
                if let Some(max) = self.config.max_attempts
                    && lease.attempt > max
                {
                    return self.dead_letter(&lease, Mode::Lease).await;
                }
                match self
                    .run_handler(lease, &mut handler, encode, retry, retries)
                    .await
                {
                    Ran::Settled(answer) => return answer,
                    Ran::Again(lease, failure) => {
                        retries += 1;
                        retry_counted(key, Mode::Lease, "transient");
                        let delay = retry.delay(retries);
                        self.pause_then_release(&lease, delay, &failure, Mode::Lease)
                            .await?;
                    }
                }
            }
        })
        .await
    }

    /// Claim `key` in lease mode: `Ok(lease)` to run the handler; otherwise the delivery's
    /// answer (busy, a replayed outcome, failure or dead letter) as `Err(Ok(..))`, or the
    /// store's error. Logs a suppressed duplicate if [`InboxConfig::log_duplicates`] asks.
    async fn acquire<T>(
        &self,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
        decode: Decode<T>,
        mode: Mode,
    ) -> Result<Lease, Result<Handled<T>, InboxError>> {
        self.retention
            .start(&self.store, self.config.retention, self.config.lease);
        let options = ClaimOptions {
            lease: self.config.lease,
            fingerprint: fingerprint.cloned(),
        };
        let answer = match self.store.claim(key, &options).await {
            Ok(Claim::Acquired(lease)) => return Ok(lease),
            Ok(Claim::InFlight {
                expires_at,
                attempt,
            }) => Ok(Handled::Busy {
                expires_at,
                attempt,
            }),
            Ok(Claim::Completed {
                processed_at,
                outcome,
            }) => replay(key, processed_at, outcome, decode, mode),
            Err(e) => return Err(Err(InboxError::Store(e))),
        };
        if let Ok(handled) = &answer {
            log_duplicate(self.config.log_duplicates, key, handled_name(handled));
        }
        Err(answer)
    }

    /// Keep `lease` through `delay` (renewed, so duplicates meanwhile answer busy), then
    /// release it for the next run's claim.
    /// The attempt's `failure` is kept on the record by the release.
    async fn pause_then_release(
        &self,
        lease: &Lease,
        delay: Duration,
        failure: &Failure,
        mode: Mode,
    ) -> Result<(), InboxError> {
        let mut guard = ReleaseOnDrop {
            store: Arc::clone(&self.store),
            lease: Some(lease.clone()),
        };
        tokio::select! {
            biased;
            lost = self.keep_renewed(lease) => {
                guard.disarm();
                return Err(InboxError::LeaseLost { key: lost.key });
            }
            () = tokio::time::sleep(delay) => {}
        }
        guard.disarm();
        attempt_failed(&lease.key, mode, failure, "it runs again after the delay");
        let released = if self.store.capabilities().failure_causes {
            self.store.release_failed(lease, failure).await
        } else {
            self.store.release(lease).await
        };
        match released {
            Ok(()) => Ok(()),
            Err(e) if e.is_lease_lost() => Err(InboxError::LeaseLost {
                key: lease.key.clone(),
            }),
            Err(e) => Err(InboxError::Store(e)),
        }
    }

    /// Run the handler under `lease` and settle the key with what it returned, or hand the
    /// lease back for another run ([`Ran::Again`]) after a [`Transient`] error the
    /// [`HandlerRetry`] still covers (`retries` runs again so far).
    async fn run_handler<T, F, Fut, E>(
        &self,
        lease: Lease,
        handler: &mut F,
        encode: Encode<T>,
        retry: &HandlerRetry,
        retries: u32,
    ) -> Ran<T>
    where
        F: FnMut(Lease) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        let key = lease.key.clone();
        let mut guard = ReleaseOnDrop {
            store: Arc::clone(&self.store),
            lease: Some(lease.clone()),
        };
        let started = Instant::now();
        let work = AssertUnwindSafe(handler(lease.clone())).catch_unwind();
        let result = tokio::select! {
            biased;
            lost = self.keep_renewed(&lease) => {
                guard.disarm();
                handler_finished(&key, Mode::Lease, "lease_lost", started);
                return Ran::Settled(Err(InboxError::LeaseLost { key: lost.key }));
            }
            result = work => result,
        };
        Ran::Settled(match result {
            Err(panic) => {
                handler_finished(&key, Mode::Lease, "panic", started);
                guard.disarm();
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|m| (*m).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "the handler panicked".to_owned());
                let failure = Failure::new("panic", vec![message], lease.attempt, now(), None)
                    .with_worker(self.worker.as_deref())
                    .fit();
                self.release_failed(&lease, &failure, Mode::Lease).await;
                std::panic::resume_unwind(panic)
            }
            Ok(Err(e)) => {
                handler_finished(&key, Mode::Lease, "error", started);
                let source: BoxError = e.into();
                guard.disarm();
                let failure = self.failure_of(&*source, &lease);
                if retry.again(retries, &*source) {
                    return Ran::Again(lease, failure);
                }
                if self.config.failures == FailurePolicy::Store && !Transient::is_in(&*source) {
                    return Ran::Settled(self.store_failure(&lease, failure, Mode::Lease).await);
                }
                self.release_failed(&lease, &failure, Mode::Lease).await;
                Err(InboxError::Handler {
                    key,
                    failure: Box::new(failure),
                    source,
                })
            }
            Ok(Ok(value)) => {
                handler_finished(&key, Mode::Lease, "ok", started);
                let bytes = encode(&value).and_then(|bytes| {
                    if Verdict::is_reserved(bytes.as_deref()) {
                        Err(
                            "a handler's outcome may not start with the reserved bytes \\0dedup:"
                                .into(),
                        )
                    } else {
                        Ok(bytes)
                    }
                });
                let bytes = match bytes {
                    Ok(bytes) => bytes,
                    Err(source) => {
                        guard.disarm();
                        let failure = Failure::of_error(
                            "outcome",
                            &*source,
                            lease.attempt,
                            now(),
                            self.worker.as_deref(),
                        );
                        self.release_failed(&lease, &failure, Mode::Lease).await;
                        return Ran::Settled(Err(InboxError::Outcome { key, source }));
                    }
                };
                let committed = self.commit(&lease, bytes.as_deref()).await;
                guard.disarm();
                committed.map(|()| Handled::Processed {
                    outcome: value,
                    lease,
                })
            }
        })
    }

    /// Commit with the configured retries.
    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<(), InboxError> {
        match self
            .config
            .commit_retry
            .run(|| self.store.commit(lease, outcome))
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if e.is_lease_lost() => Err(InboxError::LeaseLost {
                key: lease.key.clone(),
            }),
            Err(e) => Err(InboxError::Store(e)),
        }
    }

    /// Renew `lease` every `renew_every` until renewal answers `LeaseLost` (then return
    /// the lease that was lost). Transient renewal errors are retried at the next tick.
    async fn keep_renewed(&self, lease: &Lease) -> Lease {
        let every = self
            .config
            .renew_every
            .unwrap_or(self.config.lease / 3)
            .max(Duration::from_millis(1));
        let mut current = lease.clone();
        loop {
            tokio::time::sleep(every).await;
            match self.store.renew(&current, self.config.lease).await {
                Ok(renewed) => current = renewed,
                Err(e) if e.is_lease_lost() => return current,
                Err(_) => continue,
            }
        }
    }
}

/// What a delivery of an already completed key gets back.
fn replay<T>(
    key: &Key,
    processed_at: Timestamp,
    outcome: Option<Vec<u8>>,
    decode: Decode<T>,
    mode: Mode,
) -> Result<Handled<T>, InboxError> {
    match Verdict::decode(outcome) {
        Verdict::Processed(bytes) => match decode(bytes) {
            Ok(outcome) => Ok(Handled::Duplicate {
                processed_at,
                outcome,
            }),
            Err(source) => Err(InboxError::Outcome {
                key: key.clone(),
                source,
            }),
        },
        Verdict::Failed { message, .. } => Ok(Handled::Failed {
            error: message,
            replay: true,
        }),
        Verdict::DeadLetter { attempts, cause } => {
            dead_letter_counted(key, attempts, cause, true, mode)
        }
    }
}

/// How one run of the handler ended.
enum Ran<T> {
    /// The delivery's answer.
    Settled(Result<Handled<T>, InboxError>),
    /// A [`Transient`] error the [`HandlerRetry`] covers: run again as a new attempt; the
    /// lease is still held.
    Again(Lease, Failure),
}

/// Releases the lease in the background if the handling future is dropped mid-work.
struct ReleaseOnDrop<S: DedupStore + ?Sized + 'static> {
    store: Arc<S>,
    lease: Option<Lease>,
}

impl<S: DedupStore + ?Sized + 'static> ReleaseOnDrop<S> {
    fn disarm(&mut self) {
        self.lease = None;
    }
}

impl<S: DedupStore + ?Sized + 'static> Drop for ReleaseOnDrop<S> {
    fn drop(&mut self) {
        if let (Some(lease), Ok(rt)) = (self.lease.take(), tokio::runtime::Handle::try_current()) {
            let store = Arc::clone(&self.store);
            rt.spawn(async move {
                let _ = store.release(&lease).await;
            });
        }
    }
}
