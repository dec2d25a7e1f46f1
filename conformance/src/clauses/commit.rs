//! Commit: completion, retry safety, and fencing by token.

use std::time::Duration;

use dedup_core::DedupStore;

use crate::StoreFactory;
use crate::support::{
    LEASE, acquire, assert_completed_by, assert_lease_lost, claim, commit_ok, completed,
    forged_lease, key, opts, record, setup, taken_over, unchanged,
};

/// Commit makes the key completed: later claims get `Completed` with the commit time and
/// the outcome, and `get` shows the committing token, fence and attempt.
pub async fn commit_completes_the_key<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "commit_completes_the_key").await;
    let k = key("m1");
    let lease = acquire(&store, &k).await;
    ctx.clock.advance(Duration::from_millis(1234));
    commit_ok(&store, &lease, Some(b"done")).await;
    let processed_at = ctx.now();
    assert_completed_by(&store, &lease, processed_at, Some(b"done")).await;
    ctx.clock.advance(LEASE * 10);
    assert_eq!(
        claim(&store, &k, &opts()).await,
        completed(processed_at, Some(b"done")),
        "a duplicate after commit gets Completed, long after the lease"
    );
}

/// Commit is retry-safe: committing again with the same lease (a retry after a lost reply)
/// is `Ok` and keeps the first outcome and commit time.
pub async fn commit_is_retry_safe_for_the_same_lease<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "commit_is_retry_safe_for_the_same_lease").await;
    let k = key("m1");
    let lease = acquire(&store, &k).await;
    commit_ok(&store, &lease, Some(b"first")).await;
    let processed_at = ctx.now();
    ctx.clock.advance(LEASE * 2);
    for retry in [Some(&b"second"[..]), None, Some(&b"first"[..])] {
        unchanged(
            &store,
            &k,
            "a repeated commit",
            commit_ok(&store, &lease, retry),
        )
        .await;
    }
    assert_completed_by(&store, &lease, processed_at, Some(b"first")).await;
}

/// A lease that expired but was not taken over can still commit (its token still holds
/// the record).
pub async fn an_expired_lease_not_taken_over_can_commit<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "an_expired_lease_not_taken_over_can_commit").await;
    let k = key("m1");
    let lease = acquire(&store, &k).await;
    ctx.clock.advance(LEASE * 3);
    commit_ok(&store, &lease, Some(b"late")).await;
    assert_completed_by(&store, &lease, ctx.now(), Some(b"late")).await;
}

/// After a takeover the old lease's commit is `LeaseLost` and changes nothing, before and
/// after the new owner commits; the new owner's commit succeeds.
pub async fn stale_commit_after_takeover_is_rejected<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "stale_commit_after_takeover_is_rejected").await;
    let k = key("m1");
    let (stale, current) = taken_over(&store, &ctx, &k).await;
    let lost = unchanged(
        &store,
        &k,
        "a stale commit",
        store.commit(&stale, Some(b"stale")),
    )
    .await;
    assert_lease_lost(lost, &k, "commit of a lease taken over");
    commit_ok(&store, &current, Some(b"current")).await;
    let processed_at = ctx.now();
    ctx.clock.advance(Duration::from_millis(10));
    let lost = unchanged(&store, &k, "a stale commit", store.commit(&stale, None)).await;
    assert_lease_lost(
        lost,
        &k,
        "commit of a lease whose key another token completed",
    );
    assert_completed_by(&store, &current, processed_at, Some(b"current")).await;
}

/// A lease the store never handed out (a random token) cannot commit: on an absent key it
/// writes nothing, on a key in flight under another token it changes nothing.
pub async fn commit_with_an_unknown_token_is_rejected<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "commit_with_an_unknown_token_is_rejected").await;
    let absent = key("never-claimed");
    let lost = store
        .commit(&forged_lease(&absent, ctx.now()), Some(b"x"))
        .await;
    assert_lease_lost(lost, &absent, "commit of an unknown lease on an absent key");
    assert_eq!(
        record(&store, &absent).await,
        None,
        "a rejected commit must not create a record"
    );
    let held = key("held");
    acquire(&store, &held).await;
    let forged = forged_lease(&held, ctx.now());
    let lost = unchanged(
        &store,
        &held,
        "a forged commit",
        store.commit(&forged, None),
    )
    .await;
    assert_lease_lost(lost, &held, "commit with another token");
}
