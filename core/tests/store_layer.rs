//! Layers written outside `dedup-core`: a layer overrides what it changes and gets the
//! rest forwarded, each operation once, batches as batches.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dedup_core::layers::{Layered, Retry, RetryPolicy, StoreLayer};
use dedup_core::{
    Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Failure, Key, MemoryStore,
    PurgeOptions, Record, RecordState, Result,
};

/// Counts single claims; overrides nothing else.
#[derive(Default)]
struct CountClaims(AtomicU64);

impl<S: DedupStore> StoreLayer<S> for CountClaims {
    async fn claim(&self, inner: &S, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        self.0.fetch_add(1, Ordering::Relaxed);
        inner.claim(key, options).await
    }
}

/// Notes the name of every operation it runs; overrides only `around`.
#[derive(Default)]
struct Trail(Mutex<Vec<&'static str>>);

impl<S: DedupStore> StoreLayer<S> for Trail {
    async fn around<T, F, Fut>(&self, op: &'static str, mut call: F) -> Result<T>
    where
        T: Send,
        F: FnMut() -> Fut + Send,
        Fut: Future<Output = Result<T>> + Send,
    {
        self.0.lock().unwrap().push(op);
        call().await
    }
}

fn key(id: &str) -> Key {
    Key::new("billing", id).unwrap()
}

#[tokio::test]
async fn a_layer_that_overrides_claim_gets_every_other_operation_forwarded() {
    let store = Layered::wrap(MemoryStore::new(), CountClaims::default());
    let claim = store.claim(&key("m1"), &ClaimOptions::default()).await;
    let lease = claim.unwrap().into_lease().unwrap();
    store.commit(&lease, Some(b"done")).await.unwrap();

    assert_eq!(store.layer().0.load(Ordering::Relaxed), 1);
    let stored = store.inner().get(&key("m1")).await.unwrap().unwrap();
    let outcome = |record: &Record| match &record.state {
        RecordState::Completed { outcome, .. } => outcome.clone(),
        RecordState::InFlight { .. } => None,
    };
    assert_eq!(
        outcome(&stored),
        Some(b"done".to_vec()),
        "the commit reached the store"
    );
    let read = store.get(&key("m1")).await.unwrap().unwrap();
    assert_eq!(read, stored, "get is forwarded");
    assert_eq!(store.capabilities(), MemoryStore::new().capabilities());
}

#[tokio::test]
async fn a_batch_goes_to_the_inner_batch_not_through_the_single_claim() {
    let store = Layered::wrap(MemoryStore::new(), CountClaims::default());
    let requests = [
        ClaimRequest::new(key("m1"), ClaimOptions::default()),
        ClaimRequest::new(key("m2"), ClaimOptions::default()),
    ];
    let claims = store.claim_many(&requests).await.unwrap();

    assert!(claims.iter().all(|c| c.as_ref().unwrap().is_acquired()));
    assert_eq!(
        store.layer().0.load(Ordering::Relaxed),
        0,
        "claim_many is the inner store's batch: the single claim's override never runs"
    );
}

#[tokio::test]
async fn each_operation_runs_through_around_once_by_its_name() {
    let store = Layered::wrap(MemoryStore::new(), Trail::default());
    let options = ClaimOptions::default();
    let lease = store.claim(&key("m1"), &options).await.unwrap();
    let lease = lease.into_lease().unwrap();
    let lease = store.renew(&lease, Duration::from_secs(30)).await.unwrap();
    store.release(&lease).await.unwrap();
    let failure = Failure::new("handler", vec!["boom".into()], 1, lease.expires_at, None);
    store.release_failed(&lease, &failure).await.unwrap();
    let batch = [ClaimRequest::new(key("m1"), options.clone())];
    let claimed = store.claim_many(&batch).await.unwrap();
    let lease = claimed
        .into_iter()
        .next()
        .unwrap()
        .unwrap()
        .into_lease()
        .unwrap();
    store.commit(&lease, None).await.unwrap();
    store
        .commit_many(&[CommitRequest {
            lease,
            outcome: None,
        }])
        .await
        .unwrap();
    store.get(&key("m1")).await.unwrap();
    let week = Duration::from_secs(7 * 24 * 3600);
    store.purge(&PurgeOptions::older_than(week)).await.unwrap();

    let trail = store.layer().0.lock().unwrap().clone();
    assert_eq!(
        trail,
        [
            "claim",
            "renew",
            "release",
            "release_failed",
            "claim_many",
            "commit",
            "commit_many",
            "get",
            "purge"
        ]
    );
}

#[tokio::test]
async fn a_layered_store_takes_another_layer() {
    let store = Retry::new(
        Layered::wrap(MemoryStore::new(), CountClaims::default()),
        RetryPolicy::NEVER,
    );
    let claim = store.claim(&key("m1"), &ClaimOptions::default()).await;

    assert!(claim.unwrap().is_acquired());
    assert_eq!(store.inner().layer().0.load(Ordering::Relaxed), 1);
    assert_eq!(*store.layer(), RetryPolicy::NEVER);
}
