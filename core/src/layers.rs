//! Layers: wrappers that add behaviour to any store behind the same trait (as OpenDAL's
//! layers do). Stack them: `Metered::new(Retry::new(store, RetryPolicy::default()))`.
//!
//! - [`Retry`]: repeats operations that failed with a retryable error.
//! - [`Metered`]: counts operations and their outcomes, for metrics export.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::store::ItemResult;
use crate::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Key, Lease,
    PurgeOptions, PurgeReport, Record, Result,
};

/// How [`Retry`] retries.
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

/// Retries every operation that fails with [`Error::is_retryable`](crate::Error::is_retryable).
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

    async fn run<T, F, Fut>(&self, mut op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut backoff = self.policy.initial_backoff;
        let mut retries = 0;
        loop {
            match op().await {
                Err(e) if e.is_retryable() && retries < self.policy.max_retries => {
                    retries += 1;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.policy.max_backoff);
                }
                other => return other,
            }
        }
    }
}

#[async_trait]
impl<S: DedupStore> DedupStore for Retry<S> {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        self.run(|| self.inner.claim(key, options)).await
    }
    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        self.run(|| self.inner.claim_many(requests)).await
    }
    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        self.run(|| self.inner.renew(lease, extend_by)).await
    }
    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        self.run(|| self.inner.commit(lease, outcome)).await
    }
    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        self.run(|| self.inner.commit_many(requests)).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.run(|| self.inner.release(lease)).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        self.run(|| self.inner.get(key)).await
    }
    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        self.run(|| self.inner.purge(options)).await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

/// Counts of what a [`Metered`] store saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Claims (single or batched items) that acquired a lease.
    pub acquired: u64,
    /// Claims answered `InFlight`.
    pub in_flight: u64,
    /// Claims answered `Completed`: duplicates suppressed.
    pub completed: u64,
    /// Successful commits.
    pub commits: u64,
    /// Releases.
    pub releases: u64,
    /// Operations (or batch items) answered `LeaseLost`.
    pub lease_lost: u64,
    /// Records removed by purges.
    pub purged: u64,
    /// Any other error (invalid input, fingerprint mismatch, backend failures).
    pub errors: u64,
}

/// Counts operations and outcomes of the wrapped store; read them with [`Metered::metrics`]
/// and export them to your metrics system.
#[derive(Debug, Default)]
pub struct Metered<S> {
    inner: S,
    counters: [AtomicU64; 8],
}

const ACQUIRED: usize = 0;
const IN_FLIGHT: usize = 1;
const COMPLETED: usize = 2;
const COMMITS: usize = 3;
const RELEASES: usize = 4;
const LEASE_LOST: usize = 5;
const PURGED: usize = 6;
const ERRORS: usize = 7;

impl<S> Metered<S> {
    /// Wrap `inner` with all counts at zero.
    pub fn new(inner: S) -> Self {
        Metered {
            inner,
            counters: Default::default(),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The counts so far.
    pub fn metrics(&self) -> Metrics {
        let c = |i: usize| self.counters[i].load(Ordering::Relaxed);
        Metrics {
            acquired: c(ACQUIRED),
            in_flight: c(IN_FLIGHT),
            completed: c(COMPLETED),
            commits: c(COMMITS),
            releases: c(RELEASES),
            lease_lost: c(LEASE_LOST),
            purged: c(PURGED),
            errors: c(ERRORS),
        }
    }

    fn bump(&self, i: usize, n: u64) {
        self.counters[i].fetch_add(n, Ordering::Relaxed);
    }

    fn error(&self, e: &crate::Error) {
        self.bump(
            if e.is_lease_lost() {
                LEASE_LOST
            } else {
                ERRORS
            },
            1,
        );
    }

    fn claim_result(&self, r: &Result<Claim>) {
        match r {
            Ok(Claim::Acquired(_)) => self.bump(ACQUIRED, 1),
            Ok(Claim::InFlight { .. }) => self.bump(IN_FLIGHT, 1),
            Ok(Claim::Completed { .. }) => self.bump(COMPLETED, 1),
            Err(e) => self.error(e),
        }
    }

    fn unit_result(&self, r: &Result<()>, ok: usize) {
        match r {
            Ok(()) => self.bump(ok, 1),
            Err(e) => self.error(e),
        }
    }

    fn batch<T>(&self, r: &Result<Vec<ItemResult<T>>>, item: impl Fn(&ItemResult<T>)) {
        match r {
            Ok(items) => items.iter().for_each(item),
            Err(e) => self.error(e),
        }
    }
}

#[async_trait]
impl<S: DedupStore> DedupStore for Metered<S> {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        let r = self.inner.claim(key, options).await;
        self.claim_result(&r);
        r
    }
    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        let r = self.inner.claim_many(requests).await;
        self.batch(&r, |item| self.claim_result(item));
        r
    }
    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        let r = self.inner.renew(lease, extend_by).await;
        if let Err(e) = &r {
            self.error(e);
        }
        r
    }
    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        let r = self.inner.commit(lease, outcome).await;
        self.unit_result(&r, COMMITS);
        r
    }
    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        let r = self.inner.commit_many(requests).await;
        self.batch(&r, |item| self.unit_result(item, COMMITS));
        r
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        let r = self.inner.release(lease).await;
        self.unit_result(&r, RELEASES);
        r
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        let r = self.inner.get(key).await;
        if let Err(e) = &r {
            self.error(e);
        }
        r
    }
    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        let r = self.inner.purge(options).await;
        match &r {
            Ok(report) => self.bump(PURGED, report.total()),
            Err(e) => self.error(e),
        }
        r
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}
