//! Claim: acquire, in flight, takeover, completed.

use std::time::Duration;

use dedup_core::{Claim, ClaimOptions, DedupStore, Key, RecordState};

use crate::{StoreFactory, TestContext};

/// The lease most clauses claim with.
pub const LEASE: Duration = Duration::from_secs(10);

pub(crate) fn key(id: &str) -> Key {
    Key::new("billing", id).expect("valid key")
}

pub(crate) fn opts() -> ClaimOptions {
    ClaimOptions::lease(LEASE)
}

/// The first claim of an absent key acquires a lease with fence 1, attempt 1, expiring
/// `lease` after now, and `get` shows it in flight with that token.
pub async fn first_claim_acquires<F: StoreFactory>(factory: &F) {
    let ctx = TestContext::new("first_claim_acquires");
    let store = factory.open(&ctx).await;
    let k = key("m1");
    let lease = match store.claim(&k, &opts()).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        other => panic!("first claim must acquire, got {other:?}"),
    };
    assert_eq!(
        (lease.fence, lease.attempt),
        (1, 1),
        "fence and attempt of a first claim"
    );
    assert_eq!(lease.key, k);
    assert_eq!(lease.expires_at, ctx.now().saturating_add(LEASE));
    let rec = store.get(&k).await.expect("get").expect("record exists");
    match rec.state {
        RecordState::InFlight { token, expires_at } => {
            assert_eq!(token, lease.token);
            assert_eq!(expires_at, lease.expires_at);
        }
        other => panic!("record must be in flight, got {other:?}"),
    }
}

/// A claim while another lease is live returns `InFlight` with that lease's expiry and
/// attempt, and changes nothing, up to the last millisecond of the lease.
pub async fn live_lease_gives_in_flight<F: StoreFactory>(factory: &F) {
    let ctx = TestContext::new("live_lease_gives_in_flight");
    let store = factory.open(&ctx).await;
    let k = key("m1");
    let lease = store
        .claim(&k, &opts())
        .await
        .expect("claim")
        .into_lease()
        .expect("acquired");
    let before = store.get(&k).await.expect("get");
    ctx.clock.advance(LEASE - Duration::from_millis(1));
    let second = store.claim(&k, &opts()).await.expect("second claim");
    assert_eq!(
        second,
        Claim::InFlight {
            expires_at: lease.expires_at,
            attempt: 1
        },
        "a live lease must give InFlight"
    );
    assert_eq!(
        store.get(&k).await.expect("get"),
        before,
        "InFlight must change nothing"
    );
}

/// Once the lease expired, a claim takes the key over: a new token, fence 2, attempt 2.
pub async fn expired_lease_is_taken_over<F: StoreFactory>(factory: &F) {
    let ctx = TestContext::new("expired_lease_is_taken_over");
    let store = factory.open(&ctx).await;
    let k = key("m1");
    let first = store
        .claim(&k, &opts())
        .await
        .expect("claim")
        .into_lease()
        .expect("acquired");
    ctx.clock.advance(LEASE);
    let second = match store.claim(&k, &opts()).await.expect("takeover claim") {
        Claim::Acquired(lease) => lease,
        other => panic!("an expired lease must be taken over, got {other:?}"),
    };
    assert_ne!(second.token, first.token, "a takeover gets a new token");
    assert_eq!(
        (second.fence, second.attempt),
        (2, 2),
        "takeover: fence+1, attempt+1"
    );
}
