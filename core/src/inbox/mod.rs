//! [`Inbox`]: run a handler at most once per key, under a lease that renews itself, with
//! an attempt limit for poison messages and stored failures.

mod config;
mod error;
mod handled;
#[cfg(feature = "serde")]
mod json;
mod stored;
mod tx;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use tracing::Instrument;

pub use config::{FailurePolicy, InboxConfig};
pub use error::InboxError;
pub use handled::Handled;
use stored::Stored;
pub use tx::{TxAttempt, TxAttempts, TxEngine};

use crate::layers::metric_names as m;
use crate::{BoxError, Claim, ClaimOptions, DedupStore, Fingerprint, Key, Lease, Timestamp};

/// Turns a handler's value into outcome bytes.
type Encode<T> = fn(&T) -> Result<Option<Vec<u8>>, BoxError>;
/// Turns stored outcome bytes back into a handler's value.
type Decode<T> = fn(Option<Vec<u8>>) -> Result<T, BoxError>;

/// Wraps a store and runs handlers effectively once per key.
///
/// For each delivery: claim the key; on `Acquired` run the handler while renewing the lease
/// in the background; commit with the handler's outcome on success; on error release (or,
/// with [`FailurePolicy::Store`], commit the failure); release on panic, before the panic
/// continues; report a duplicate with the stored outcome; report busy when another worker
/// holds a live lease; and past [`InboxConfig::max_attempts`] report a dead letter without
/// running the handler. If the future returned by [`handle`](Self::handle) is dropped
/// mid-handler (a cancelled task, a shutdown), the lease is released in the background so
/// the key is not stuck until the lease expires.
///
/// Observability: each call runs in a `dedup_inbox` span (fields `consumer`, `attempt`,
/// `result`; never the message id: the store's spans carry it when allowed), records
/// [`dedup_handler_duration_seconds`](crate::layers::metric_names::HANDLER_DURATION_SECONDS)
/// and counts dead letters and stored failures. Its store operations (claims, takeovers,
/// renewals, lost leases, commits) are counted by wrapping the store in
/// [`Observed`](crate::layers::Observed).
///
/// ```
/// # tokio_test_block_on(async {
/// use dedup_core::{Handled, Inbox, Key, MemoryStore};
/// let inbox = Inbox::new(MemoryStore::new());
/// let key = Key::new("billing", "order-42")?;
/// let charge = |_lease| async { Ok::<_, std::io::Error>(Some(b"charged".to_vec())) };
/// assert!(matches!(inbox.handle(&key, None, charge).await?, Handled::Processed { .. }));
/// let again = inbox.handle(&key, None, charge).await?;
/// assert!(again.is_replay());
/// assert!(matches!(again, Handled::Duplicate { outcome: Some(o), .. } if o == b"charged"));
/// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
/// # }).unwrap();
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Debug)]
pub struct Inbox<S: ?Sized> {
    config: InboxConfig,
    store: Arc<S>,
}

impl<S: ?Sized> Clone for Inbox<S> {
    fn clone(&self) -> Self {
        Inbox {
            config: self.config.clone(),
            store: Arc::clone(&self.store),
        }
    }
}

impl<S: DedupStore + 'static> Inbox<S> {
    /// An inbox over `store` with the default configuration.
    pub fn new(store: S) -> Self {
        Self::from_arc(Arc::new(store), InboxConfig::default())
    }
}

impl<S: DedupStore + ?Sized + 'static> Inbox<S> {
    /// An inbox over a shared store (e.g. `Arc<dyn DedupStore>`) with `config`.
    pub fn from_arc(store: Arc<S>, config: InboxConfig) -> Self {
        Inbox { config, store }
    }

    /// The same inbox with another configuration.
    pub fn with_config(mut self, config: InboxConfig) -> Self {
        self.config = config;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &InboxConfig {
        &self.config
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// Process `key` at most once: see the type's docs. `handler` gets the lease (for its
    /// fence and idempotency key) and returns the outcome to store for duplicates (at most
    /// [`MAX_OUTCOME_LEN`](crate::MAX_OUTCOME_LEN) bytes, not starting with the reserved
    /// bytes `\0dedup:`). Its error may be any type that converts into a
    /// `Box<dyn Error + Send + Sync>` (`std` errors, `anyhow::Error`, `String`, `&str`).
    pub async fn handle<F, Fut, E>(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        handler: F,
    ) -> Result<Handled, InboxError>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<Option<Vec<u8>>, E>>,
        E: Into<BoxError>,
    {
        self.run(key, fingerprint, handler, |o| Ok(o.clone()), Ok)
            .await
    }

    /// The work of [`handle`](Self::handle) for outcomes of type `T`.
    async fn run<T, F, Fut, E>(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        handler: F,
        encode: Encode<T>,
        decode: Decode<T>,
    ) -> Result<Handled<T>, InboxError>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        let span = tracing::debug_span!(
            "dedup_inbox",
            mode = Mode::Lease.label(),
            consumer = key.consumer(),
            attempt = tracing::field::Empty,
            result = tracing::field::Empty,
        );
        let handled = async {
            let options = ClaimOptions {
                lease: self.config.lease,
                fingerprint,
            };
            let lease = match self.store.claim(key, &options).await {
                Ok(Claim::Acquired(lease)) => lease,
                Ok(Claim::InFlight {
                    expires_at,
                    attempt,
                }) => {
                    return Ok(Handled::Busy {
                        expires_at,
                        attempt,
                    });
                }
                Ok(Claim::Completed {
                    processed_at,
                    outcome,
                }) => return replay(key, processed_at, outcome, decode, Mode::Lease),
                Err(e) => return Err(InboxError::Store(e)),
            };
            span.record("attempt", lease.attempt);
            match self.config.max_attempts {
                Some(max) if lease.attempt > max => self.dead_letter(&lease, Mode::Lease).await,
                _ => self.run_handler(lease, handler, encode).await,
            }
        }
        .instrument(span.clone())
        .await;
        span.record("result", result_name(&handled));
        handled
    }

    /// Run the handler under `lease` and settle the key with what it returned.
    async fn run_handler<T, F, Fut, E>(
        &self,
        lease: Lease,
        handler: F,
        encode: Encode<T>,
    ) -> Result<Handled<T>, InboxError>
    where
        F: FnOnce(Lease) -> Fut,
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
                return Err(InboxError::LeaseLost { key: lost.key });
            }
            result = work => result,
        };
        match result {
            Err(panic) => {
                handler_finished(&key, Mode::Lease, "panic", started);
                guard.disarm();
                let _ = self.store.release(&lease).await;
                std::panic::resume_unwind(panic)
            }
            Ok(Err(e)) => {
                handler_finished(&key, Mode::Lease, "error", started);
                let source: BoxError = e.into();
                if self.config.failures == FailurePolicy::Store {
                    let error = error_chain(&*source);
                    let committed = self.commit(&lease, Some(&Stored::failed(&error))).await;
                    guard.disarm();
                    committed?;
                    failure_stored(&key, Mode::Lease);
                    return Ok(Handled::Failed {
                        error,
                        replay: false,
                    });
                }
                guard.disarm();
                let _ = self.store.release(&lease).await;
                Err(InboxError::Handler { key, source })
            }
            Ok(Ok(value)) => {
                handler_finished(&key, Mode::Lease, "ok", started);
                let bytes = encode(&value).and_then(|bytes| {
                    if Stored::is_reserved(bytes.as_deref()) {
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
                        let _ = self.store.release(&lease).await;
                        return Err(InboxError::Outcome { key, source });
                    }
                };
                let committed = self.commit(&lease, bytes.as_deref()).await;
                guard.disarm();
                committed?;
                Ok(Handled::Processed {
                    outcome: value,
                    lease,
                })
            }
        }
    }

    /// Complete a key that used up its attempts as dead-lettered, without running the
    /// handler.
    async fn dead_letter<T>(&self, lease: &Lease, mode: Mode) -> Result<Handled<T>, InboxError> {
        let attempts = lease.attempt - 1;
        self.commit(lease, Some(&Stored::dead_letter(attempts)))
            .await?;
        tracing::warn!(
            consumer = lease.key.consumer(),
            attempts,
            "dead-lettered: the key used up its attempts"
        );
        dead_letter_counted(&lease.key, attempts, false, mode)
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
    match Stored::decode(outcome) {
        Stored::Outcome(bytes) => match decode(bytes) {
            Ok(outcome) => Ok(Handled::Duplicate {
                processed_at,
                outcome,
            }),
            Err(source) => Err(InboxError::Outcome {
                key: key.clone(),
                source,
            }),
        },
        Stored::Failed(error) => Ok(Handled::Failed {
            error,
            replay: true,
        }),
        Stored::DeadLetter(attempts) => dead_letter_counted(key, attempts, true, mode),
    }
}

/// Count a dead-lettered delivery and say so.
fn dead_letter_counted<T>(
    key: &Key,
    attempts: u32,
    replay: bool,
    mode: Mode,
) -> Result<Handled<T>, InboxError> {
    metrics::counter!(m::DEAD_LETTERS_TOTAL, "consumer" => key.consumer().to_owned(), "replay" => if replay { "true" } else { "false" }, "mode" => mode.label())
        .increment(1);
    Ok(Handled::DeadLetter { attempts, replay })
}

/// Count a handler failure stored as the key's result.
fn failure_stored(key: &Key, mode: Mode) {
    metrics::counter!(m::STORED_FAILURES_TOTAL, "consumer" => key.consumer().to_owned(), "mode" => mode.label())
        .increment(1);
}

/// Which wrapper handled a delivery: the `mode` label and span field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// [`Inbox`]: the handler runs under a renewed lease.
    Lease,
    /// [`TxEngine`]: the handler runs inside the store's transaction.
    Tx,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Lease => "lease",
            Mode::Tx => "tx",
        }
    }
}

/// The `result` field of the `dedup_inbox` span.
fn result_name<T>(handled: &Result<Handled<T>, InboxError>) -> &'static str {
    match handled {
        Ok(Handled::Processed { .. }) => "processed",
        Ok(Handled::Duplicate { .. }) => "duplicate",
        Ok(Handled::Busy { .. }) => "busy",
        Ok(Handled::Failed { .. }) => "failed",
        Ok(Handled::DeadLetter { .. }) => "dead_letter",
        Err(InboxError::Handler { .. }) => "handler_error",
        Err(InboxError::LeaseLost { .. }) => "lease_lost",
        Err(InboxError::Store(_)) => "store_error",
        Err(InboxError::Outcome { .. }) => "outcome_error",
    }
}

/// Record how long a handler ran and how it ended.
fn handler_finished(key: &Key, mode: Mode, result: &'static str, started: Instant) {
    metrics::histogram!(m::HANDLER_DURATION_SECONDS, "consumer" => key.consumer().to_owned(), "result" => result, "mode" => mode.label())
        .record(started.elapsed().as_secs_f64());
}

/// An error's message followed by its sources' (`outer: inner: root`).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
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
