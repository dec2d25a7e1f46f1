//! The Retry and Observed layers.

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dedup_core::layers::{Counts, ObserveOptions, Observed, Retry, RetryPolicy};
use dedup_core::{Claim, ClaimOptions, ClaimRequest, DedupStore, Key, Lease, MemoryStore};
use support::flaky;

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
async fn observed_counts_outcomes() {
    let store = Observed::new(Arc::new(MemoryStore::new()), ObserveOptions::new("memory"));
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
        store.counts(),
        Counts {
            acquired: 2,
            in_flight: 1,
            completed: 2,
            commits: 1,
            lease_lost: 1,
            errors: 1,
            ..Counts::default()
        }
    );
}
