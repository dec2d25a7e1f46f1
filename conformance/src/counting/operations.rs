//! The operations every backend's cost guard measures the same way, on any [`DedupStore`]:
//! lease mode one key at a time, batches of 100, one purge batch. Each backend's
//! `op_counts` test gives its expected [`LeaseCosts`] and adds what only it has (the
//! transactional claim, `TxInbox`, the outbox).

use std::time::Duration;

use dedup_core::{
    Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, ItemResult, Key, Lease, Pace,
    PurgeOptions,
};

use super::{Cost, CostGuard};

/// The consumer of every key the guards measure.
const CONSUMER: &str = "op-counts";

/// The lease every measured claim asks for (never runs out during a guard).
const LEASE: Duration = Duration::from_secs(30);

/// The lease of a claim the guard lets run out, to measure a takeover.
const RUNS_OUT: Duration = Duration::from_millis(20);

/// The expected cost of each operation [`check_lease_mode`] measures.
#[derive(Clone, Copy, Debug)]
pub struct LeaseCosts {
    /// `claim` of a key nobody claimed.
    pub claim_fresh: Cost,
    /// `claim` of a key another lease holds.
    pub claim_in_flight: Cost,
    /// `claim` of a committed key.
    pub claim_completed: Cost,
    /// `claim` of a key whose lease ran out: a takeover.
    pub claim_expired: Cost,
    /// `renew` of a held lease.
    pub renew: Cost,
    /// `commit` with an outcome.
    pub commit: Cost,
    /// `release` of a held lease.
    pub release: Cost,
    /// `claim_many` of 100 fresh keys.
    pub claim_many_100: Cost,
    /// `commit_many` of 100 held leases.
    pub commit_many_100: Cost,
}

/// The key `id` of the guards' consumer.
pub fn key(id: &str) -> Key {
    Key::new(CONSUMER, id).expect("a valid key")
}

/// The lease of an acquired claim; panics on anything else.
pub fn acquired(claim: Claim) -> Lease {
    match claim {
        Claim::Acquired(lease) => lease,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

fn hundred(prefix: &str, options: &ClaimOptions) -> Vec<ClaimRequest> {
    (0..100)
        .map(|i| ClaimRequest::new(key(&format!("{prefix}{i}")), options.clone()))
        .collect()
}

fn commits(claims: Vec<ItemResult<Claim>>) -> Vec<CommitRequest> {
    claims
        .into_iter()
        .map(|c| CommitRequest {
            lease: acquired(c.expect("claimed")),
            outcome: Some(b"done".to_vec()),
        })
        .collect()
}

/// Measure the lease-mode operations on `store` against `expected`: each runs once on keys
/// of its own (`w*`: the first use of a statement or script prepares or loads it) before
/// it is measured on `a` / `b` / `e` / `m*`, one call at a time. The keys `w1`, `w2`,
/// `we`, `wm*`, `a`, `b`, `e` and `m*` of consumer `op-counts` must be unused.
pub async fn check_lease_mode(g: &mut CostGuard, store: &dyn DedupStore, expected: &LeaseCosts) {
    let options = ClaimOptions::lease(LEASE);

    let warm = acquired(store.claim(&key("w1"), &options).await.unwrap());
    let lease = acquired(
        g.check(
            "claim of a fresh key",
            expected.claim_fresh,
            store.claim(&key("a"), &options),
        )
        .await
        .unwrap(),
    );
    store.claim(&key("w1"), &options).await.unwrap();
    let claim = g
        .check(
            "claim of a key in flight",
            expected.claim_in_flight,
            store.claim(&key("a"), &options),
        )
        .await
        .unwrap();
    assert!(matches!(claim, Claim::InFlight { .. }), "{claim:?}");
    let warm = store.renew(&warm, Duration::from_secs(60)).await.unwrap();
    let lease = g
        .check(
            "renew",
            expected.renew,
            store.renew(&lease, Duration::from_secs(60)),
        )
        .await
        .unwrap();
    store.commit(&warm, Some(b"done")).await.unwrap();
    g.check(
        "commit",
        expected.commit,
        store.commit(&lease, Some(b"done")),
    )
    .await
    .unwrap();
    store.claim(&key("w1"), &options).await.unwrap();
    let claim = g
        .check(
            "claim of a completed key",
            expected.claim_completed,
            store.claim(&key("a"), &options),
        )
        .await
        .unwrap();
    assert!(matches!(claim, Claim::Completed { .. }), "{claim:?}");
    let warm = acquired(store.claim(&key("w2"), &options).await.unwrap());
    let lease = acquired(store.claim(&key("b"), &options).await.unwrap());
    store.release(&warm).await.unwrap();
    g.check("release", expected.release, store.release(&lease))
        .await
        .unwrap();

    let short = ClaimOptions::lease(RUNS_OUT);
    acquired(store.claim(&key("we"), &short).await.unwrap());
    acquired(store.claim(&key("e"), &short).await.unwrap());
    tokio::time::sleep(RUNS_OUT * 5).await;
    acquired(store.claim(&key("we"), &options).await.unwrap());
    acquired(
        g.check(
            "claim of a key whose lease ran out",
            expected.claim_expired,
            store.claim(&key("e"), &options),
        )
        .await
        .unwrap(),
    );

    let warm = store.claim_many(&hundred("wm", &options)).await.unwrap();
    let requests = hundred("m", &options);
    let claimed = g
        .check(
            "claim_many of 100 keys",
            expected.claim_many_100,
            store.claim_many(&requests),
        )
        .await
        .unwrap();
    store.commit_many(&commits(warm)).await.unwrap();
    let requests = commits(claimed);
    for done in g
        .check(
            "commit_many of 100 keys",
            expected.commit_many_100,
            store.commit_many(&requests),
        )
        .await
        .unwrap()
    {
        done.expect("committed");
    }
}

/// Measure one purge batch of 10 completed records on `store` against `expected` (after one
/// unmeasured batch). The store must hold at least 20 completed records (after
/// [`check_lease_mode`] it holds 202).
pub async fn check_purge_batch(g: &mut CostGuard, store: &dyn DedupStore, expected: Cost) {
    let purge = PurgeOptions::older_than(Duration::ZERO)
        .batch_size(10)
        .max_batches(1)
        .pace(Pace::Unpaced);
    store.purge(&purge).await.unwrap();
    let report = g
        .check("purge of one batch", expected, store.purge(&purge))
        .await
        .unwrap();
    assert_eq!(report.completed + report.expired, 10, "{report:?}");
}
