//! Purge: what is removed (only what is past retention, never a live lease), in batches,
//! with counts, also from several tasks at once.
//!
//! These clauses advance the clock by at most a day. A store that also expires records by
//! itself (Redis, configured for a retention of 7 days or more) must still remove and count
//! them when `purge` runs with a shorter retention.

use std::time::Duration;

use dedup_core::{ClaimOptions, DedupStore, Key, PurgeOptions, PurgeReport};

use crate::StoreFactory;
use crate::support::{
    LEASE, acquire, acquire_with, assert_lease_lost, commit_ok, complete, handles, join_all, key,
    record, release_ok, setup,
};

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

/// Purge that must succeed, unpaced (so every batch but the last removes exactly
/// `batch_size`, and batch counts are exact); returns (completed, expired, batches).
async fn purge<S: DedupStore + ?Sized>(
    store: &S,
    retention: Duration,
    batch_size: usize,
    max_batches: Option<u32>,
) -> PurgeReport {
    let mut options = PurgeOptions::older_than(retention)
        .batch_size(batch_size)
        .unpaced();
    if let Some(max) = max_batches {
        options = options.max_batches(max);
    }
    run(store, &options).await
}

async fn run<S: DedupStore + ?Sized>(store: &S, options: &PurgeOptions) -> PurgeReport {
    store
        .purge(options)
        .await
        .unwrap_or_else(|e| panic!("purge({options:?}) failed: {e:?}"))
}

/// A report's counts: (completed, expired, batches).
fn counts(r: PurgeReport) -> (u64, u64, u32) {
    (r.completed, r.expired, r.batches)
}

fn report(completed: u64, expired: u64, batches: u32) -> (u64, u64, u32) {
    (completed, expired, batches)
}

/// Claim `key` with a lease of `lease`, which must acquire.
async fn claim_for<S: DedupStore + ?Sized>(store: &S, key: &Key, lease: Duration) {
    acquire_with(store, key, &ClaimOptions::lease(lease)).await;
}

/// Create `completed` completed and `expired` in-flight records (1 s leases) named
/// `{prefix}-c{i}` / `{prefix}-e{i}`; returns their keys.
async fn old_records<S: DedupStore + ?Sized>(
    store: &S,
    prefix: &str,
    completed: usize,
    expired: usize,
) -> Vec<Key> {
    let mut keys = Vec::with_capacity(completed + expired);
    for i in 0..completed {
        let k = key(&format!("{prefix}-c{i}"));
        complete(store, &k, Some(b"old")).await;
        keys.push(k);
    }
    for i in 0..expired {
        let k = key(&format!("{prefix}-e{i}"));
        claim_for(store, &k, Duration::from_secs(1)).await;
        keys.push(k);
    }
    keys
}

async fn assert_all_absent<S: DedupStore + ?Sized>(store: &S, keys: &[Key]) {
    for k in keys {
        assert_eq!(record(store, k).await, None, "{k} must have been purged");
    }
}

/// Purge removes completed records processed before now - retention and in-flight records
/// that expired (or were released) before it, keeps records exactly at the cutoff, recent
/// ones and live leases, reports what it removed by kind, and removes nothing the second
/// time.
pub async fn purge_removes_only_what_is_past_retention<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "purge_removes_only_what_is_past_retention").await;
    let retention = HOUR;
    // t0
    complete(&store, &key("old-done"), Some(b"x")).await;
    claim_for(&store, &key("old-expired"), Duration::from_secs(1)).await;
    let released = acquire(&store, &key("old-released")).await;
    release_ok(&store, &released).await;
    claim_for(&store, &key("live"), 3 * HOUR).await;
    // t0 + 1001 ms: the cutoff of the purge below ("old-expired" expired 1 ms before it).
    ctx.clock.advance(Duration::from_millis(1001));
    complete(&store, &key("edge-done"), None).await;
    let edge = acquire(&store, &key("edge-released")).await;
    release_ok(&store, &edge).await;
    ctx.clock.advance(retention / 2);
    complete(&store, &key("recent-done"), Some(b"")).await;
    claim_for(&store, &key("recent-expired"), Duration::from_secs(1)).await;
    ctx.clock.advance(retention / 2);

    let kept = [
        "live",
        "edge-done",
        "edge-released",
        "recent-done",
        "recent-expired",
    ]
    .map(key);
    let mut before = Vec::new();
    for k in &kept {
        before.push(record(&store, k).await);
    }
    assert_eq!(
        counts(purge(&store, retention, 1000, None).await),
        report(1, 2, 1),
        "removed: old-done (completed), old-expired and old-released (expired)"
    );
    assert_all_absent(
        &store,
        &["old-done", "old-expired", "old-released"].map(key),
    )
    .await;
    for (k, rec) in kept.iter().zip(before) {
        assert_eq!(record(&store, k).await, rec, "{k} must survive the purge");
    }
    assert_eq!(
        counts(purge(&store, retention, 1000, None).await),
        report(0, 0, 1),
        "a second purge removes nothing"
    );
}

/// Purge never removes a live lease, however old its claim and however short the
/// retention (even zero), including a lease kept alive by renewal; the lease can still
/// commit afterwards.
pub async fn purge_never_removes_a_live_lease<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "purge_never_removes_a_live_lease").await;
    let long = acquire_with(&store, &key("long"), &ClaimOptions::lease(2 * DAY)).await;
    let short = acquire(&store, &key("renewed")).await;
    let renewed = store.renew(&short, 2 * DAY).await.expect("renew");
    claim_for(&store, &key("expired"), Duration::from_secs(1)).await;
    ctx.clock.advance(DAY);
    let before = (
        record(&store, &long.key).await,
        record(&store, &renewed.key).await,
    );
    assert_eq!(
        counts(purge(&store, Duration::ZERO, 1000, None).await),
        report(0, 1, 1),
        "retention zero removes only the expired lease"
    );
    assert_eq!(
        (
            record(&store, &long.key).await,
            record(&store, &renewed.key).await
        ),
        before,
        "live leases must survive purge"
    );
    commit_ok(&store, &long, Some(b"still mine")).await;
    commit_ok(&store, &renewed, None).await;
}

/// Purge works in batches of `batch_size`, stops after `max_batches` (reporting it stopped
/// early), and reports the batches it ran (the last, short one included) and the records
/// removed by kind.
pub async fn purge_works_in_batches_and_reports_counts<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "purge_works_in_batches_and_reports_counts").await;
    let keys = old_records(&store, "b", 25, 5).await;
    ctx.clock.advance(2 * HOUR);
    let first = purge(&store, HOUR, 7, Some(2)).await;
    assert_eq!(
        (first.total(), first.batches, first.stopped_early),
        (14, 2, true),
        "two batches of 7, then stop early: {first:?}"
    );
    let rest = purge(&store, HOUR, 7, None).await;
    assert_eq!(
        (rest.total(), rest.batches, rest.stopped_early),
        (16, 3, false),
        "the remaining 16 in batches of 7, 7 and 2, to the end: {rest:?}"
    );
    assert_eq!(
        (
            first.completed + rest.completed,
            first.expired + rest.expired
        ),
        (25, 5),
        "records removed by kind"
    );
    assert_all_absent(&store, &keys).await;
}

/// Purge run from 8 tasks on 4 handles at once removes each record exactly once: the
/// reports add up to the number of old records and none is left.
pub async fn concurrent_purges_remove_each_record_once<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "concurrent_purges_remove_each_record_once").await;
    let keys = old_records(&store, "p", 120, 40).await;
    ctx.clock.advance(2 * HOUR);
    let stores = handles(factory, &ctx, 4).await;
    let tasks = (0..8)
        .map(|i| {
            let s = stores[i % stores.len()].clone();
            tokio::spawn(async move { purge(&*s, HOUR, 10, None).await })
        })
        .collect();
    let reports = join_all(tasks).await;
    let completed: u64 = reports.iter().map(|r| r.completed).sum();
    let expired: u64 = reports.iter().map(|r| r.expired).sum();
    assert_eq!(
        (completed, expired),
        (120, 40),
        "each record counted once across concurrent purges: {reports:?}"
    );
    assert_all_absent(&store, &keys).await;
}

/// A purged key is forgotten: the old lease's commit, renew and release are `LeaseLost`
/// and write nothing, and the next claim starts again at fence 1 (completed keys too).
pub async fn a_purged_key_starts_afresh_and_its_old_lease_is_lost<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(
        factory,
        "a_purged_key_starts_afresh_and_its_old_lease_is_lost",
    )
    .await;
    let k = key("expired");
    let stale = acquire(&store, &k).await;
    let done = key("done");
    complete(&store, &done, None).await;
    ctx.clock.advance(LEASE * 2);
    assert_eq!(
        counts(purge(&store, LEASE / 2, 1000, None).await),
        report(1, 1, 1)
    );
    assert_lease_lost(store.commit(&stale, None).await, &k, "commit after purge");
    assert_lease_lost(store.renew(&stale, LEASE).await, &k, "renew after purge");
    assert_lease_lost(store.release(&stale).await, &k, "release after purge");
    assert_eq!(
        record(&store, &k).await,
        None,
        "stale operations must not recreate a purged record"
    );
    for k in [k, done] {
        let fresh = acquire(&store, &k).await;
        assert_eq!((fresh.fence, fresh.attempt), (1, 1), "{k} starts afresh");
    }
}

/// A purge with the default options is paced: it starts with small batches (more than one
/// batch for a backlog of 150), still removes every old record and nothing live, and
/// reports how long it took.
pub async fn a_default_purge_is_paced_and_removes_every_old_record<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(
        factory,
        "a_default_purge_is_paced_and_removes_every_old_record",
    )
    .await;
    let keys = old_records(&store, "d", 100, 50).await;
    ctx.clock.advance(2 * HOUR);
    let live = key("live");
    claim_for(&store, &live, 2 * HOUR).await;
    let before = record(&store, &live).await;
    let report = run(&store, &PurgeOptions::older_than(HOUR)).await;
    assert_eq!(
        (report.completed, report.expired),
        (100, 50),
        "every old record, counted by kind: {report:?}"
    );
    assert!(
        report.batches >= 2,
        "a paced purge starts with small batches: {report:?}"
    );
    assert!(
        report.elapsed > Duration::ZERO,
        "elapsed reported: {report:?}"
    );
    assert_all_absent(&store, &keys).await;
    assert_eq!(
        record(&store, &live).await,
        before,
        "the live lease is kept"
    );
}
