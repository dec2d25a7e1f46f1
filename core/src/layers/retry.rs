//! [`Retry`] and [`RetryPolicy`]: the one retry rule of `dedup` (the [`Inbox`](crate::Inbox)
//! retries its commits with it too).

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;

use crate::store::ItemResult;
use crate::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Key, Lease,
    PurgeOptions, PurgeReport, Record, Result,
};

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
/// following a [`RetryPolicy`].
///
/// Safe for every operation of the contract: commit is retry-safe, release answers `Ok`
/// again, renew and get are idempotent, purge counts only what it removed. A claim whose
/// reply was lost and that is retried answers `InFlight` for its own first attempt (the
/// key is then claimable again when that lease expires): nothing is processed twice, but
/// the message is delayed by one lease. Contract outcomes (`LeaseLost`,
/// `FingerprintMismatch`, invalid input) are never retried.
#[derive(Clone, Debug)]
pub struct Retry<S> {
    inner: S,
    policy: RetryPolicy,
}

impl<S> Retry<S> {
    /// Wrap `inner`.
    pub fn new(inner: S, policy: RetryPolicy) -> Self {
        Retry { inner, policy }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

#[async_trait]
impl<S: DedupStore> DedupStore for Retry<S> {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        self.policy.run(|| self.inner.claim(key, options)).await
    }
    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        self.policy.run(|| self.inner.claim_many(requests)).await
    }
    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        self.policy.run(|| self.inner.renew(lease, extend_by)).await
    }
    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        self.policy.run(|| self.inner.commit(lease, outcome)).await
    }
    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        self.policy.run(|| self.inner.commit_many(requests)).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.policy.run(|| self.inner.release(lease)).await
    }
    async fn release_failed(&self, lease: &Lease, failure: &crate::Failure) -> Result<()> {
        self.policy
            .run(|| self.inner.release_failed(lease, failure))
            .await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        self.policy.run(|| self.inner.get(key)).await
    }
    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        self.policy.run(|| self.inner.purge(options)).await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}
