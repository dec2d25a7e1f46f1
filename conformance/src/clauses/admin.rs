//! The operator's extension ([`Admin`]): listing, counting, releasing and forgetting by
//! hand agree with what [`get`](dedup_core::DedupStore::get) sees; an operator release
//! revokes the lease at once, and a forget makes the key start over.

use std::collections::BTreeMap;
use std::time::Duration;

use dedup_core::admin::{Admin, Forgot, KeySummary, ListFilter, Released, Stats, Status};
use dedup_core::{Claim, DedupStore, Key, Record};

use crate::StoreFactory;
use crate::support::{
    LEASE, acquire, assert_lease_lost, claim, commit_ok, complete, expect_acquired, key, key_for,
    opts, record, release_ok, setup,
};

/// A list call that must not fail.
async fn list<S: Admin + ?Sized>(store: &S, filter: ListFilter) -> Vec<Record> {
    store
        .list(&filter)
        .await
        .unwrap_or_else(|e| panic!("list {filter:?} failed: {e:?}"))
}

/// The message ids of `records`, in order.
fn ids(records: &[Record]) -> Vec<&str> {
    records.iter().map(|r| r.key.message_id()).collect()
}

/// Stats that must not fail.
async fn stats<S: Admin + ?Sized>(store: &S, top: usize) -> Stats {
    store
        .stats(top)
        .await
        .unwrap_or_else(|e| panic!("stats failed: {e:?}"))
}

/// A release by hand that must not fail.
async fn release_key<S: Admin + ?Sized>(store: &S, key: &Key, force: bool) -> Released {
    store
        .release_key(key, force)
        .await
        .unwrap_or_else(|e| panic!("release_key({key}, force {force}) failed: {e:?}"))
}

/// A forget by hand that must not fail.
async fn forget<S: Admin + ?Sized>(store: &S, key: &Key, force: bool) -> Forgot {
    store
        .forget(key, force)
        .await
        .unwrap_or_else(|e| panic!("forget({key}, force {force}) failed: {e:?}"))
}

/// Records of consumers whose names are prefixes, extensions, case variants or glob
/// patterns of each other never show up in each other's listing, whatever the filter.
pub async fn listing_never_shows_another_consumers_records<F: StoreFactory>(factory: &F)
where
    F::Store: Admin,
{
    let (_ctx, store) = setup(factory, "listing_never_shows_another_consumers_records").await;
    let consumers = [
        "billing",
        "bill",
        "billing:eu",
        "billing*",
        "Billing",
        "b?lling",
    ];
    for consumer in consumers {
        for id in ["a", "b:c", "z"] {
            complete(
                &store,
                &key_for(consumer, &format!("{consumer}/{id}")),
                None,
            )
            .await;
        }
    }
    for consumer in consumers {
        let all = list(&store, ListFilter::consumer(consumer)).await;
        assert_eq!(
            ids(&all),
            ["a", "b:c", "z"].map(|id| format!("{consumer}/{id}")),
            "listing {consumer:?} must show exactly its three records"
        );
        assert!(
            all.iter().all(|r| r.key.consumer() == consumer),
            "listing {consumer:?} showed another consumer's record: {all:?}"
        );
        let completed = list(
            &store,
            ListFilter::consumer(consumer).status(Status::Completed),
        )
        .await;
        assert_eq!(completed, all, "all of {consumer:?} is completed");
    }
    assert!(
        list(&store, ListFilter::consumer("nobody"))
            .await
            .is_empty(),
        "a consumer without records lists nothing"
    );
}

/// Listing filters by status at the store's "now", returns records in message id order
/// exactly as `get` returns them, honours the limit, and pages with `after` without
/// skipping or repeating a record.
pub async fn list_filters_by_status_and_pages_in_message_id_order<F: StoreFactory>(factory: &F)
where
    F::Store: Admin,
{
    let (ctx, store) = setup(
        factory,
        "list_filters_by_status_and_pages_in_message_id_order",
    )
    .await;
    // m1, m4: completed; m2: expired (its lease ran out); m3: released (expired now);
    // m5: live.
    complete(&store, &key("m1"), Some(b"ok")).await;
    acquire(&store, &key("m2")).await;
    ctx.clock.advance(LEASE);
    let released = acquire(&store, &key("m3")).await;
    release_ok(&store, &released).await;
    complete(&store, &key("m4"), None).await;
    acquire(&store, &key("m5")).await;
    complete(&store, &key_for("other", "m0"), None).await;

    let expect = [
        (None, vec!["m1", "m2", "m3", "m4", "m5"]),
        (Some(Status::Completed), vec!["m1", "m4"]),
        (Some(Status::Expired), vec!["m2", "m3"]),
        (Some(Status::InFlight), vec!["m5"]),
    ];
    for (status, want) in expect {
        let mut filter = ListFilter::consumer("billing");
        filter.status = status;
        let got = list(&store, filter).await;
        assert_eq!(ids(&got), want, "listing status {status:?}");
        for r in &got {
            assert_eq!(
                Some(r),
                record(&store, &r.key).await.as_ref(),
                "a listed record is what get returns"
            );
        }
    }
    let mut paged = Vec::new();
    let mut filter = ListFilter::consumer("billing").limit(2);
    // Five records in pages of two: three pages, and an empty fourth. More means paging
    // repeats records (bounded, so a broken store fails instead of looping forever).
    for _ in 0..4 {
        let page = list(&store, filter.clone()).await;
        assert!(page.len() <= 2, "a page holds at most the limit: {page:?}");
        let Some(last) = page.last() else {
            break;
        };
        filter = filter.after(last.key.message_id());
        paged.extend(page.iter().map(|r| r.key.message_id().to_owned()));
    }
    assert_eq!(
        paged,
        ["m1", "m2", "m3", "m4", "m5"],
        "pages of two, in order"
    );
    assert!(
        store
            .list(&ListFilter::consumer("billing").limit(0))
            .await
            .unwrap_err()
            .is_invalid_input(),
        "a zero limit is invalid input"
    );
}

/// The counts equal what `get` sees for every key (live, expired, released, completed),
/// the oldest live lease is the live one expiring first, the most retried keys come in
/// attempt order, and "now" is the store's clock.
pub async fn counts_equal_what_get_sees<F: StoreFactory>(factory: &F)
where
    F::Store: Admin,
{
    let (ctx, store) = setup(factory, "counts_equal_what_get_sees").await;
    let empty = stats(&store, 10).await;
    assert_eq!(
        (empty.total(), &empty.oldest_live, empty.most_retried.len()),
        (0, &None, 0),
        "an empty store counts nothing"
    );
    let mut keys = Vec::new();
    for i in 0..3 {
        let k = key_for("a", &format!("done{i}"));
        complete(&store, &k, None).await;
        keys.push(k);
    }
    let stuck = key_for("b", "stuck");
    acquire(&store, &stuck).await;
    keys.push(stuck);
    ctx.clock.advance(Duration::from_secs(1));
    let first_live = key_for("a", "live-first");
    acquire(&store, &first_live).await;
    ctx.clock.advance(Duration::from_secs(1));
    // Retried three times (attempt 3), then live again.
    let retried = key_for("b", "retried");
    for _ in 0..2 {
        let lease = acquire(&store, &retried).await;
        release_ok(&store, &lease).await;
    }
    acquire(&store, &retried).await;
    // Retried once (attempt 2), then completed.
    let once = key_for("c", "once");
    let lease = acquire(&store, &once).await;
    release_ok(&store, &lease).await;
    complete(&store, &once, None).await;
    ctx.clock.advance(LEASE - Duration::from_millis(1500));
    keys.extend([first_live.clone(), retried.clone(), once.clone()]);

    let now = ctx.now();
    assert_eq!(
        store.now().await.expect("now"),
        now,
        "the store's now is its clock"
    );
    let mut seen: BTreeMap<Status, u64> = BTreeMap::new();
    let mut records = Vec::new();
    for k in &keys {
        let r = record(&store, k).await.expect("a record for each key");
        *seen.entry(Status::of(&r, now)).or_default() += 1;
        records.push(r);
    }
    let got = stats(&store, 10).await;
    assert_eq!(got.now, now, "stats are taken at the store's now");
    for status in [Status::InFlight, Status::Expired, Status::Completed] {
        assert_eq!(
            got.count(status),
            seen.get(&status).copied().unwrap_or(0),
            "count of {status:?} must equal what get sees"
        );
    }
    assert_eq!((got.in_flight, got.expired, got.completed), (2, 1, 4));
    let summary = |k: &Key| {
        let r = records.iter().find(|r| &r.key == k).expect("record");
        KeySummary::of(r, now)
    };
    assert_eq!(
        got.oldest_live,
        Some(summary(&first_live)),
        "the oldest live lease is the live one expiring first"
    );
    assert_eq!(
        got.most_retried,
        vec![summary(&retried), summary(&once)],
        "most retried: attempt 3, then attempt 2; keys never retried are left out"
    );
    let top1 = stats(&store, 1).await;
    assert_eq!(top1.most_retried, vec![summary(&retried)], "top 1");
}

/// An operator release of a live lease (forced) ends in a takeover: the next claim takes
/// the key over with fence + 1, and the worker that held it gets `LeaseLost` on commit.
pub async fn operator_release_then_reclaim_gives_the_next_fence_and_the_old_lease_is_lost<
    F: StoreFactory,
>(
    factory: &F,
) where
    F::Store: Admin,
{
    let (_ctx, store) = setup(
        factory,
        "operator_release_then_reclaim_gives_the_next_fence_and_the_old_lease_is_lost",
    )
    .await;
    let k = key("stuck");
    let old = acquire(&store, &k).await;
    assert_eq!(
        release_key(&store, &k, true).await,
        Released::Released {
            fence: old.fence,
            attempt: old.attempt,
            was_live: true,
        }
    );
    let next = expect_acquired(claim(&store, &k, &opts()).await, "the claim after release");
    assert_eq!(
        (next.fence, next.attempt),
        (old.fence + 1, old.attempt + 1),
        "a re-claim after an operator release is a takeover"
    );
    assert_lease_lost(
        store.commit(&old, Some(b"late")).await,
        &k,
        "the old worker's commit after an operator release and re-claim",
    );
    commit_ok(&store, &next, Some(b"ok")).await;
}

/// Without `force` a live lease is not released (and nothing changes); completed and
/// absent keys have nothing to release; an expired lease needs no `force`.
pub async fn operator_release_of_a_live_lease_needs_force<F: StoreFactory>(factory: &F)
where
    F::Store: Admin,
{
    let (ctx, store) = setup(factory, "operator_release_of_a_live_lease_needs_force").await;
    let k = key("live");
    let lease = acquire(&store, &k).await;
    let before = record(&store, &k).await;
    assert_eq!(
        release_key(&store, &k, false).await,
        Released::LiveLease {
            expires_at: lease.expires_at,
            attempt: 1
        }
    );
    assert_eq!(
        record(&store, &k).await,
        before,
        "a refused release changes nothing"
    );
    assert!(
        matches!(claim(&store, &k, &opts()).await, Claim::InFlight { .. }),
        "the lease is still live"
    );
    let done = key("done");
    let committed = complete(&store, &done, None).await;
    let processed_at = ctx.now();
    assert_eq!(
        release_key(&store, &done, true).await,
        Released::Completed { processed_at },
        "a completed key ({committed:?}) has no lease"
    );
    assert_eq!(
        release_key(&store, &key("absent"), true).await,
        Released::NotFound
    );
    ctx.clock.advance(LEASE);
    assert_eq!(
        release_key(&store, &k, false).await,
        Released::Released {
            fence: 1,
            attempt: 1,
            was_live: false,
        },
        "an expired lease is released without force"
    );
    let next = expect_acquired(claim(&store, &k, &opts()).await, "claim after release");
    assert_eq!(next.fence, 2);
}

/// A dry run counts exactly what the purge then removes, by kind, and removes nothing.
pub async fn count_purgeable_equals_what_purge_removes<F: StoreFactory>(factory: &F)
where
    F::Store: Admin,
{
    let (ctx, store) = setup(factory, "count_purgeable_equals_what_purge_removes").await;
    let retention = Duration::from_secs(60);
    // Old: two completed, one expired; then, a minute later, one completed and one live.
    complete(&store, &key("old1"), None).await;
    complete(&store, &key("old2"), None).await;
    acquire(&store, &key("old-stuck")).await;
    ctx.clock
        .advance(retention + LEASE + Duration::from_secs(1));
    complete(&store, &key("new"), None).await;
    acquire(&store, &key("live")).await;
    let count = store
        .count_purgeable(retention)
        .await
        .expect("count_purgeable");
    assert_eq!(
        (count.completed, count.expired),
        (2, 1),
        "two old completed records and one long-expired lease"
    );
    assert!(
        record(&store, &key("old1")).await.is_some(),
        "a dry run removes nothing"
    );
    let report = store
        .purge(&dedup_core::PurgeOptions::older_than(retention).unpaced())
        .await
        .expect("purge");
    assert_eq!(
        (report.completed, report.expired),
        (count.completed, count.expired),
        "the purge removes what the dry run counted"
    );
    let after = store.count_purgeable(retention).await.expect("count");
    assert_eq!(after.total(), 0, "nothing purgeable is left");
}

/// An operator release revokes the holder at once: before anyone claims the key again, the
/// worker that held the lease gets `LeaseLost` on commit, renew and release, and nothing it
/// tries changes the record; the next claim then takes the key over with fence + 1.
pub async fn operator_release_revokes_the_holder_at_once<F: StoreFactory>(factory: &F)
where
    F::Store: Admin,
{
    let (_ctx, store) = setup(factory, "operator_release_revokes_the_holder_at_once").await;
    let k = key("stuck");
    let old = acquire(&store, &k).await;
    assert!(
        matches!(
            release_key(&store, &k, true).await,
            Released::Released { was_live: true, .. }
        ),
        "a forced release of a live lease releases it"
    );
    let revoked = record(&store, &k).await;
    assert_lease_lost(
        store.commit(&old, Some(b"late")).await,
        &k,
        "the old worker's commit right after an operator release",
    );
    assert_lease_lost(
        store.renew(&old, LEASE).await,
        &k,
        "the old worker's renew right after an operator release",
    );
    assert_lease_lost(
        store.release(&old).await,
        &k,
        "the old worker's release right after an operator release",
    );
    assert_eq!(
        record(&store, &k).await,
        revoked,
        "the revoked worker's attempts change nothing"
    );
    let next = expect_acquired(
        claim(&store, &k, &opts()).await,
        "the claim after an operator release",
    );
    assert_eq!(
        (next.fence, next.attempt),
        (old.fence + 1, old.attempt + 1),
        "the claim after an operator release is a takeover"
    );
    commit_ok(&store, &next, Some(b"ok")).await;
}

/// Forgetting a completed record or one whose lease expired removes it: `get` finds
/// nothing, and the next claim is processed as new, at fence 1 and attempt 1.
pub async fn forget_removes_a_completed_or_expired_record_and_the_key_starts_over<F: StoreFactory>(
    factory: &F,
) where
    F::Store: Admin,
{
    let (ctx, store) = setup(
        factory,
        "forget_removes_a_completed_or_expired_record_and_the_key_starts_over",
    )
    .await;
    // "done": completed at fence 2, attempt 2 (one takeover first).
    let done = key("done");
    acquire(&store, &done).await;
    ctx.clock.advance(LEASE);
    let lease = acquire(&store, &done).await;
    commit_ok(&store, &lease, Some(b"ok")).await;
    // "stuck": its lease expired.
    let stuck = key("stuck");
    acquire(&store, &stuck).await;
    ctx.clock.advance(LEASE);
    let other = key("other");
    complete(&store, &other, None).await;
    let untouched = record(&store, &other).await;
    assert_eq!(
        forget(&store, &done, false).await,
        Forgot::Forgot {
            status: Status::Completed,
            fence: 2,
            attempt: 2,
        },
        "a completed record is forgotten without force"
    );
    assert_eq!(
        forget(&store, &stuck, false).await,
        Forgot::Forgot {
            status: Status::Expired,
            fence: 1,
            attempt: 1,
        },
        "an expired lease is forgotten without force"
    );
    for k in [&done, &stuck] {
        assert_eq!(record(&store, k).await, None, "{k} is forgotten");
        let again = expect_acquired(claim(&store, k, &opts()).await, "the claim after forget");
        assert_eq!(
            (again.fence, again.attempt),
            (1, 1),
            "{k} starts over after forget"
        );
        commit_ok(&store, &again, None).await;
    }
    assert_eq!(
        record(&store, &other).await,
        untouched,
        "forget removes only its own key"
    );
}

/// Without `force`, forgetting a record that holds a live lease is refused and changes
/// nothing: its worker still commits.
pub async fn forget_of_a_live_lease_without_force_changes_nothing<F: StoreFactory>(factory: &F)
where
    F::Store: Admin,
{
    let (_ctx, store) = setup(
        factory,
        "forget_of_a_live_lease_without_force_changes_nothing",
    )
    .await;
    let k = key("live");
    let lease = acquire(&store, &k).await;
    let before = record(&store, &k).await;
    assert_eq!(
        forget(&store, &k, false).await,
        Forgot::LiveLease {
            expires_at: lease.expires_at,
            attempt: lease.attempt,
        }
    );
    assert_eq!(
        record(&store, &k).await,
        before,
        "a refused forget changes nothing"
    );
    commit_ok(&store, &lease, Some(b"ok")).await;
}

/// With `force`, forgetting a record that holds a live lease removes it: its worker's
/// commit is `LeaseLost` and writes nothing, and the next claim starts over at fence 1.
pub async fn forget_with_force_removes_a_live_lease_and_its_holder_loses_it<F: StoreFactory>(
    factory: &F,
) where
    F::Store: Admin,
{
    let (_ctx, store) = setup(
        factory,
        "forget_with_force_removes_a_live_lease_and_its_holder_loses_it",
    )
    .await;
    let k = key("live");
    let old = acquire(&store, &k).await;
    assert_eq!(
        forget(&store, &k, true).await,
        Forgot::Forgot {
            status: Status::InFlight,
            fence: 1,
            attempt: 1,
        }
    );
    assert_lease_lost(
        store.commit(&old, Some(b"late")).await,
        &k,
        "the old worker's commit after a forced forget",
    );
    assert_eq!(
        record(&store, &k).await,
        None,
        "the lost commit wrote nothing"
    );
    let next = expect_acquired(
        claim(&store, &k, &opts()).await,
        "the claim after a forced forget",
    );
    assert_eq!((next.fence, next.attempt), (1, 1), "the key starts over");
}

/// Forgetting a key without a record is `NotFound`, and creates none.
pub async fn forget_of_an_absent_key_is_not_found<F: StoreFactory>(factory: &F)
where
    F::Store: Admin,
{
    let (_ctx, store) = setup(factory, "forget_of_an_absent_key_is_not_found").await;
    let k = key("absent");
    assert_eq!(forget(&store, &k, true).await, Forgot::NotFound);
    assert_eq!(forget(&store, &k, false).await, Forgot::NotFound);
    assert_eq!(record(&store, &k).await, None, "forget creates nothing");
}
