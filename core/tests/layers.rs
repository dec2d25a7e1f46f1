//! The Retry and Metered layers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::layers::{Metered, Metrics, Retry, RetryPolicy};
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Error, ItemResult,
    Key, Lease, MemoryStore, PurgeOptions, PurgeReport, Record, Result,
};

/// A MemoryStore whose next `fail` operations fail with a (retryable or not) backend error.
struct Flaky {
    inner: MemoryStore,
    fail: AtomicU32,
    retryable: bool,
}

impl Flaky {
    fn check(&self) -> Result<()> {
        if self
            .fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
            return Err(Error::backend("flaky", self.retryable, io));
        }
        Ok(())
    }
}

#[async_trait]
impl DedupStore for Flaky {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        self.check()?;
        self.inner.claim(key, options).await
    }
    async fn claim_many(&self, r: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        self.check()?;
        self.inner.claim_many(r).await
    }
    async fn renew(&self, lease: &Lease, d: Duration) -> Result<Lease> {
        self.check()?;
        self.inner.renew(lease, d).await
    }
    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        self.check()?;
        self.inner.commit(lease, outcome).await
    }
    async fn commit_many(&self, r: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        self.check()?;
        self.inner.commit_many(r).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.check()?;
        self.inner.release(lease).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        self.check()?;
        self.inner.get(key).await
    }
    async fn purge(&self, o: &PurgeOptions) -> Result<PurgeReport> {
        self.check()?;
        self.inner.purge(o).await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

fn flaky(fail: u32, retryable: bool) -> Flaky {
    Flaky {
        inner: MemoryStore::new(),
        fail: AtomicU32::new(fail),
        retryable,
    }
}

fn key() -> Key {
    Key::new("billing", "m1").unwrap()
}

#[tokio::test(start_paused = true)]
async fn retry_repeats_retryable_failures_up_to_the_policy() {
    let store = Retry::new(flaky(3, true), RetryPolicy::default());
    assert!(
        store
            .claim(&key(), &ClaimOptions::default())
            .await
            .unwrap()
            .is_acquired()
    );
    let store = Retry::new(flaky(4, true), RetryPolicy::default());
    let err = store
        .claim(&key(), &ClaimOptions::default())
        .await
        .unwrap_err();
    assert!(err.is_retryable());
    assert!(
        store.inner().inner.is_empty(),
        "the failed attempts wrote nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_leaves_permanent_errors_and_contract_outcomes_alone() {
    let store = Retry::new(flaky(1, false), RetryPolicy::default());
    assert!(
        !store
            .claim(&key(), &ClaimOptions::default())
            .await
            .unwrap_err()
            .is_retryable()
    );
    assert_eq!(store.inner().fail.load(Ordering::SeqCst), 0);
    // A LeaseLost is returned at once (one call, no retry).
    let store = Retry::new(flaky(0, true), RetryPolicy::default());
    let lease = store
        .claim(&key(), &ClaimOptions::lease(Duration::from_millis(5)))
        .await
        .unwrap();
    let lease = lease.into_lease().unwrap();
    let stale = Lease {
        token: dedup_core::LeaseToken::random(),
        ..lease
    };
    assert!(
        store
            .commit(&stale, None)
            .await
            .unwrap_err()
            .is_lease_lost()
    );
}

#[tokio::test]
async fn metered_counts_outcomes() {
    let store = Metered::new(Arc::new(MemoryStore::new()));
    let opts = ClaimOptions::default();
    let lease = store
        .claim(&key(), &opts)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    assert!(matches!(
        store.claim(&key(), &opts).await.unwrap(),
        Claim::InFlight { .. }
    ));
    store.commit(&lease, None).await.unwrap();
    assert!(matches!(
        store.claim(&key(), &opts).await.unwrap(),
        Claim::Completed { .. }
    ));
    assert!(store.release(&lease).await.unwrap_err().is_lease_lost());
    let batch = [
        ClaimRequest::new(key(), opts.clone()),
        ClaimRequest::new(Key::new("b", "2").unwrap(), opts),
    ];
    store.claim_many(&batch).await.unwrap();
    assert!(
        store
            .claim(&key(), &ClaimOptions::lease(Duration::ZERO))
            .await
            .is_err()
    );
    assert_eq!(
        store.metrics(),
        Metrics {
            acquired: 2,
            in_flight: 1,
            completed: 2,
            commits: 1,
            releases: 0,
            lease_lost: 1,
            purged: 0,
            errors: 1,
        }
    );
}
