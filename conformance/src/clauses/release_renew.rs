//! Release and renew: giving a key up, extending a lease, and fencing both by token.

use std::time::Duration;

use dedup_core::{Claim, DedupStore, Key, Lease};

use crate::support::{
    LEASE, acquire, assert_completed_by, assert_holds, assert_lease_lost, claim, commit_ok,
    expect_acquired, in_flight, key, opts, release_ok, setup, taken_over, unchanged,
};
use crate::{StoreFactory, TestContext};

/// After a release the next claim acquires at once (no clock advance), with fence and
/// attempt one higher; the released record keeps its token, fence and attempt and
/// expires at the release time.
pub async fn release_lets_the_next_claim_acquire_at_once<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "release_lets_the_next_claim_acquire_at_once").await;
    let k = key("m1");
    let lease = acquire(&store, &k).await;
    ctx.clock.advance(Duration::from_millis(1500));
    release_ok(&store, &lease).await;
    assert_eq!(
        in_flight(&store, &k).await,
        (lease.token, ctx.now(), 1, 1),
        "a released record expires now and keeps token, fence and attempt"
    );
    let next = expect_acquired(
        claim(&store, &k, &opts()).await,
        "a claim right after release",
    );
    assert_eq!((next.fence, next.attempt), (2, 2));
}

/// Fences keep growing across release: claim-and-release five times gives fences 1 to 5
/// (a release never deletes the record and never restarts the fence).
pub async fn release_keeps_the_fence_growing<F: StoreFactory>(factory: &F) {
    let (_ctx, store) = setup(factory, "release_keeps_the_fence_growing").await;
    let k = key("m1");
    for n in 1..=5u32 {
        let lease = acquire(&store, &k).await;
        assert_eq!(
            (lease.fence, lease.attempt),
            (u64::from(n), n),
            "acquisition {n} after {} releases",
            n - 1
        );
        release_ok(&store, &lease).await;
    }
}

/// Release is idempotent and only ever shortens a lease: releasing again later is `Ok`
/// and keeps the first release time; releasing an already expired lease keeps its expiry.
/// A released lease that nobody took over can still commit.
pub async fn release_is_idempotent<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "release_is_idempotent").await;
    let k = key("m1");
    let lease = acquire(&store, &k).await;
    release_ok(&store, &lease).await;
    let released_at = ctx.now();
    ctx.clock.advance(Duration::from_millis(700));
    release_ok(&store, &lease).await;
    assert_eq!(
        in_flight(&store, &k).await,
        (lease.token, released_at, 1, 1),
        "a second release keeps the first release time"
    );
    commit_ok(&store, &lease, Some(b"after release")).await;
    assert_completed_by(&store, &lease, ctx.now(), Some(b"after release")).await;

    let k2 = key("m2");
    let expired = acquire(&store, &k2).await;
    ctx.clock.advance(LEASE * 2);
    release_ok(&store, &expired).await;
    assert_holds(
        &store,
        &expired,
        "release of an expired lease keeps its expiry",
    )
    .await;
}

/// `op` with the stale lease of a key taken over must be `LeaseLost` and change nothing;
/// the new owner still holds the key.
async fn stale_op_is_rejected<S, T, Fut>(
    store: &S,
    ctx: &TestContext,
    what: &str,
    op: impl FnOnce(Lease) -> Fut,
) where
    S: DedupStore,
    T: std::fmt::Debug,
    Fut: std::future::Future<Output = dedup_core::Result<T>>,
{
    let k = key("m1");
    let (stale, current) = taken_over(store, ctx, &k).await;
    let lost = unchanged(store, &k, what, op(stale)).await;
    assert_lease_lost(lost, &k, what);
    assert_eq!(
        claim(store, &k, &opts()).await,
        Claim::InFlight {
            expires_at: current.expires_at,
            attempt: current.attempt
        },
        "{what}: the new owner must still hold the key"
    );
}

/// After a takeover the old lease's release is `LeaseLost` and changes nothing (it must not
/// free the new owner's lease).
pub async fn stale_release_after_takeover_is_rejected<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "stale_release_after_takeover_is_rejected").await;
    let s = &store;
    stale_op_is_rejected(s, &ctx, "a stale release", |stale| async move {
        s.release(&stale).await
    })
    .await;
}

/// After a takeover the old lease's renew is `LeaseLost` and changes nothing (it must not
/// extend or steal the new owner's lease).
pub async fn stale_renew_after_takeover_is_rejected<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "stale_renew_after_takeover_is_rejected").await;
    let s = &store;
    stale_op_is_rejected(s, &ctx, "a stale renew", |stale| async move {
        s.renew(&stale, LEASE * 5).await
    })
    .await;
}

/// Renew extends a lease to expire `d` after now: same token, fence and attempt; claims
/// get `InFlight` until the new expiry and take over at it.
pub async fn renew_extends_the_lease<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "renew_extends_the_lease").await;
    let k = key("m1");
    let lease = acquire(&store, &k).await;
    ctx.clock.advance(LEASE / 2);
    let renewed = store.renew(&lease, LEASE * 3).await.expect("renew");
    assert_eq!(
        renewed,
        Lease {
            expires_at: ctx.now().saturating_add(LEASE * 3),
            ..lease.clone()
        },
        "a renewed lease: same key, token, fence, attempt; expires now + d"
    );
    assert_holds(&store, &renewed, "after renew").await;
    ctx.clock.advance(LEASE);
    assert_eq!(
        claim(&store, &k, &opts()).await,
        Claim::InFlight {
            expires_at: renewed.expires_at,
            attempt: 1
        },
        "past the original expiry the renewed lease is still live"
    );
    ctx.clock.advance(renewed.expires_at.since(ctx.now()));
    let next = expect_acquired(
        claim(&store, &k, &opts()).await,
        "a claim at the renewed expiry",
    );
    assert_eq!((next.fence, next.attempt), (2, 2));
}

/// A lease that expired but was not taken over can be renewed (and is live again).
pub async fn an_expired_lease_not_taken_over_can_be_renewed<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "an_expired_lease_not_taken_over_can_be_renewed").await;
    let k = key("m1");
    let lease = acquire(&store, &k).await;
    ctx.clock.advance(LEASE * 2);
    let renewed = store
        .renew(&lease, LEASE)
        .await
        .expect("renew of an expired lease");
    assert_eq!(renewed.expires_at, ctx.now().saturating_add(LEASE));
    assert!(
        matches!(claim(&store, &k, &opts()).await, Claim::InFlight { .. }),
        "a renewed lease is live again"
    );
}

/// After commit, renew and release of that lease are `LeaseLost` and change nothing (the
/// key stays completed).
pub async fn renew_and_release_after_commit_are_rejected<F: StoreFactory>(factory: &F) {
    let (_ctx, store) = setup(factory, "renew_and_release_after_commit_are_rejected").await;
    let k: Key = key("m1");
    let lease = acquire(&store, &k).await;
    commit_ok(&store, &lease, Some(b"done")).await;
    let renew = unchanged(&store, &k, "renew after commit", store.renew(&lease, LEASE)).await;
    assert_lease_lost(renew, &k, "renew after commit");
    let release = unchanged(&store, &k, "release after commit", store.release(&lease)).await;
    assert_lease_lost(release, &k, "release after commit");
}
