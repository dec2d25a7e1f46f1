//! [`Retry`] and [`RetryPolicy`]: the one retry rule of `dedup` (the [`Inbox`](crate::Inbox)
//! retries its commits with it too).

use std::future::Future;
use std::time::Duration;

use super::{Layered, StoreLayer};
use crate::{DedupStore, Result};

/// How failed operations are retried: by [`Retry`], and by the [`Inbox`](crate::Inbox)'s
/// commit.
///
/// Only errors with [`Error::is_retryable`](crate::Error::is_retryable) are retried;
/// contract outcomes (`LeaseLost`, `FingerprintMismatch`, invalid input) never are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// Delay before the first retry; doubles each time.
    pub initial_backoff: Duration,
    /// Upper bound of the delay.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 3 retries, 50 ms doubling to at most 1 s.
    fn default() -> Self {
        RetryPolicy {
            max_retries: 3,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
        }
    }
}

impl RetryPolicy {
    /// No retries: the first answer is final.
    pub const NEVER: RetryPolicy = RetryPolicy {
        max_retries: 0,
        initial_backoff: Duration::ZERO,
        max_backoff: Duration::ZERO,
    };

    /// Run `op` until it succeeds, fails with an error that is not retryable, or
    /// `max_retries` retries have failed; sleep the backoff between tries. Returns the last
    /// answer.
    pub async fn run<T, F, Fut>(&self, mut op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut backoff = self.initial_backoff;
        let mut retries = 0;
        loop {
            match op().await {
                Err(e) if e.is_retryable() && retries < self.max_retries => {
                    retries += 1;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.max_backoff);
                }
                other => return other,
            }
        }
    }
}

/// Retries every operation that fails with [`Error::is_retryable`](crate::Error::is_retryable),
/// following a [`RetryPolicy`]: a store wrapped in the policy as a [`StoreLayer`].
///
/// Safe for every operation of the contract: commit is retry-safe, release answers `Ok`
/// again, renew and get are idempotent, purge counts only what it removed. A claim whose
/// reply was lost and that is retried answers `InFlight` for its own first attempt (the
/// key is then claimable again when that lease expires): nothing is processed twice, but
/// the message is delayed by one lease. Contract outcomes (`LeaseLost`,
/// `FingerprintMismatch`, invalid input) are never retried.
pub type Retry<S> = Layered<RetryPolicy, S>;

impl<S> Retry<S> {
    /// Wrap `inner`.
    pub fn new(inner: S, policy: RetryPolicy) -> Self {
        Layered::wrap(inner, policy)
    }
}

/// The layer of [`Retry`]: every operation runs under [`RetryPolicy::run`].
impl<S: DedupStore> StoreLayer<S> for RetryPolicy {
    async fn around<T, F, Fut>(&self, _op: &'static str, call: F) -> Result<T>
    where
        T: Send,
        F: FnMut() -> Fut + Send,
        Fut: Future<Output = Result<T>> + Send,
    {
        self.run(call).await
    }
}
