//! [`Inbox`]: run a handler at most once per key, under a lease that renews itself.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;

use crate::{ClaimOptions, DedupStore, Error, Fingerprint, Key, Lease, Timestamp};

/// How an [`Inbox`] claims and renews.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxConfig {
    /// The lease each claim and each renewal asks for.
    pub lease: Duration,
    /// How often the lease is renewed while the handler runs (`None`: a third of `lease`,
    /// so two renewals can fail before the lease runs out).
    pub renew_every: Option<Duration>,
    /// How many times a commit that failed with a retryable error is tried again
    /// (commit is retry-safe).
    pub commit_retries: u32,
}

impl Default for InboxConfig {
    /// A 30-second lease renewed every 10 seconds, 3 commit retries.
    fn default() -> Self {
        InboxConfig {
            lease: Duration::from_secs(30),
            renew_every: None,
            commit_retries: 3,
        }
    }
}

/// What happened to one delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handled {
    /// This call ran the handler and committed its outcome: acknowledge the message.
    Processed {
        /// The outcome the handler returned (and the store kept for duplicates).
        outcome: Option<Vec<u8>>,
        /// The lease the work ran under (its fence, attempt and idempotency key).
        lease: Lease,
    },
    /// Already processed earlier: acknowledge the message without processing it.
    Duplicate {
        /// When it was processed.
        processed_at: Timestamp,
        /// The outcome stored then, byte for byte.
        outcome: Option<Vec<u8>>,
    },
    /// Another worker is processing it right now: do not acknowledge; let the broker
    /// redeliver (negative-acknowledge with requeue, or leave it pending) after `expires_at`.
    Busy {
        /// When the other worker's lease expires unless renewed.
        expires_at: Timestamp,
        /// The other worker's attempt number.
        attempt: u32,
    },
}

/// Why [`Inbox::handle`] failed. In every case the message must not be acknowledged as
/// processed; the broker's redelivery retries it.
#[derive(Debug, thiserror::Error)]
pub enum InboxError<E> {
    /// The handler returned an error. The lease was released, so the next delivery retries
    /// at once.
    #[error("handler failed; the lease was released for a retry")]
    Handler(#[source] E),
    /// The lease was lost while the handler ran (renewal or commit answered `LeaseLost`):
    /// another worker took the key over after the lease expired. If the renewal noticed,
    /// the handler was stopped (its future dropped) at its next await point. Side effects it
    /// made before that are not undone; protect them with the lease's fence or idempotency key.
    #[error("lease lost while handling {key}")]
    LeaseLost {
        /// The key.
        key: Key,
    },
    /// The store failed (claim, or commit after retries). The lease, if any, expires by itself.
    #[error("dedup store failed")]
    Store(#[source] Error),
}

/// Wraps a store and runs handlers effectively once per key.
///
/// For each delivery: claim the key; on `Acquired` run the handler while renewing the lease
/// in the background; commit with the handler's outcome on success; release on error (and
/// on panic, before the panic continues); report a duplicate with the stored outcome; or
/// report busy when another worker holds a live lease. If the future returned by
/// [`handle`](Self::handle) is dropped mid-handler (a cancelled task, a shutdown), the lease
/// is released in the background so the key is not stuck until the lease expires.
///
/// ```
/// # tokio_test_block_on(async {
/// use dedup_core::{Handled, Inbox, Key, MemoryStore};
/// let inbox = Inbox::new(MemoryStore::new());
/// let key = Key::new("billing", "order-42")?;
/// let charge = |_lease| async { Ok::<_, std::io::Error>(Some(b"charged".to_vec())) };
/// assert!(matches!(inbox.handle(&key, None, charge).await?, Handled::Processed { .. }));
/// let again = inbox.handle(&key, None, charge).await?;
/// assert!(matches!(again, Handled::Duplicate { outcome: Some(o), .. } if o == b"charged"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
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

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// Process `key` at most once: see the type's docs. `handler` gets the lease (for its
    /// fence and idempotency key) and returns the outcome to store for duplicates.
    pub async fn handle<F, Fut, E>(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        handler: F,
    ) -> Result<Handled, InboxError<E>>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<Option<Vec<u8>>, E>>,
    {
        let options = ClaimOptions {
            lease: self.config.lease,
            fingerprint,
        };
        let lease = match self.store.claim(key, &options).await {
            Ok(crate::Claim::Acquired(lease)) => lease,
            Ok(crate::Claim::InFlight {
                expires_at,
                attempt,
            }) => {
                return Ok(Handled::Busy {
                    expires_at,
                    attempt,
                });
            }
            Ok(crate::Claim::Completed {
                processed_at,
                outcome,
            }) => {
                return Ok(Handled::Duplicate {
                    processed_at,
                    outcome,
                });
            }
            Err(e) => return Err(InboxError::Store(e)),
        };

        let mut guard = ReleaseOnDrop {
            store: Arc::clone(&self.store),
            lease: Some(lease.clone()),
        };
        let work = AssertUnwindSafe(handler(lease.clone())).catch_unwind();
        let result = tokio::select! {
            biased;
            lost = self.keep_renewed(&lease) => {
                guard.disarm();
                return Err(InboxError::LeaseLost { key: lost.key });
            }
            result = work => result,
        };
        match result {
            Err(panic) => {
                guard.disarm();
                let _ = self.store.release(&lease).await;
                std::panic::resume_unwind(panic)
            }
            Ok(Err(e)) => {
                guard.disarm();
                let _ = self.store.release(&lease).await;
                Err(InboxError::Handler(e))
            }
            Ok(Ok(outcome)) => {
                let committed = self.commit_with_retries(&lease, outcome.as_deref()).await;
                guard.disarm();
                match committed {
                    Ok(()) => Ok(Handled::Processed { outcome, lease }),
                    Err(e) if e.is_lease_lost() => Err(InboxError::LeaseLost { key: lease.key }),
                    Err(e) => Err(InboxError::Store(e)),
                }
            }
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

    async fn commit_with_retries(
        &self,
        lease: &Lease,
        outcome: Option<&[u8]>,
    ) -> Result<(), Error> {
        let mut tries = 0;
        loop {
            match self.store.commit(lease, outcome).await {
                Err(e) if e.is_retryable() && tries < self.config.commit_retries => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50 << tries.min(6))).await;
                }
                other => return other,
            }
        }
    }
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
