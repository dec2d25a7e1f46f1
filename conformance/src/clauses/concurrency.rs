//! Concurrency: real parallel tasks on separate handles (connections) of one store.
//!
//! Every clause opens [`HANDLES`] handles with the same context and spreads its tasks over
//! them; tasks start together behind a barrier. The suite's generated tests run on a
//! multi-threaded runtime, so tasks run in parallel.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use dedup_core::{Claim, ClaimRequest, DedupStore, Key};
use tokio::sync::Barrier;

use crate::support::{
    LEASE, Seen, acquire, assert_completed_by, assert_holds, handles, in_flight, join_all, key,
    opts, record, setup,
};
use crate::{StoreFactory, TestContext};

/// How many handles (connections) the concurrency clauses spread their tasks over.
pub const HANDLES: usize = 4;

/// Spawn `tasks` tasks spread over [`HANDLES`] handles on `ctx`, started together; task `i`
/// runs `work(i, handle)`. Returns their results in task order.
async fn race<F, T, W, Fut>(factory: &F, ctx: &TestContext, tasks: usize, work: W) -> Vec<T>
where
    F: StoreFactory,
    T: Send + 'static,
    W: Fn(usize, Arc<F::Store>) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let stores = handles(factory, ctx, HANDLES).await;
    let barrier = Arc::new(Barrier::new(tasks));
    let spawned = (0..tasks)
        .map(|i| {
            let job = work(i, stores[i % stores.len()].clone());
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                job.await
            })
        })
        .collect();
    join_all(spawned).await
}

/// `race` of one claim of `k` per task: the results.
async fn racing_claims<F: StoreFactory>(
    factory: &F,
    ctx: &TestContext,
    k: &Key,
    tasks: usize,
) -> Vec<dedup_core::Result<Claim>> {
    race(factory, ctx, tasks, |_, store| {
        let k = k.clone();
        async move { store.claim(&k, &opts()).await }
    })
    .await
}

/// Exactly one of `results` is `Acquired` with `fence`/`attempt`; every other is `InFlight`
/// for that lease; none is an error. Returns the winning lease.
fn exactly_one_acquired(
    results: Vec<dedup_core::Result<Claim>>,
    fence: u64,
    attempt: u32,
) -> dedup_core::Lease {
    let seen: Vec<Seen> = results.iter().map(Seen::claim).collect();
    let winners: Vec<_> = results
        .into_iter()
        .filter_map(|r| r.ok().and_then(Claim::into_lease))
        .collect();
    assert_eq!(
        winners.len(),
        1,
        "exactly one concurrent claim must acquire: {seen:?}"
    );
    let lease = winners.into_iter().next().expect("one winner");
    assert_eq!((lease.fence, lease.attempt), (fence, attempt));
    let loser = Seen::InFlight {
        expires_at: lease.expires_at,
        attempt,
    };
    for s in seen.iter().filter(|s| !matches!(s, Seen::Lease { .. })) {
        assert_eq!(
            s, &loser,
            "every other concurrent claim must see the winner in flight (never an error)"
        );
    }
    lease
}

/// 64 tasks on 4 handles claim one absent key at once: exactly one `Acquired` (fence 1),
/// 63 `InFlight`, no errors, and the record holds the winner's lease.
pub async fn concurrent_claims_of_one_key_acquire_exactly_once<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "concurrent_claims_of_one_key_acquire_exactly_once").await;
    let k = key("hot");
    let results = racing_claims(factory, &ctx, &k, 64).await;
    let lease = exactly_one_acquired(results, 1, 1);
    assert_holds(&store, &lease, "after 64 concurrent claims").await;
}

/// 64 tasks on 4 handles claim one key whose lease just expired: exactly one takeover
/// (fence 2, attempt 2), the rest `InFlight`, no errors.
pub async fn concurrent_takeovers_acquire_exactly_once<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "concurrent_takeovers_acquire_exactly_once").await;
    let k = key("hot");
    acquire(&store, &k).await;
    ctx.clock.advance(LEASE);
    let results = racing_claims(factory, &ctx, &k, 64).await;
    let lease = exactly_one_acquired(results, 2, 2);
    assert_holds(&store, &lease, "after 64 concurrent takeovers").await;
}

/// 40 keys delivered 3 times each, the deliveries of one key on different tasks, across 16
/// tasks on 4 handles: every delivery that acquires commits; each key is acquired and
/// completed exactly once, every other delivery is a duplicate (`InFlight` or
/// `Completed`), and no operation fails.
pub async fn redelivered_keys_are_completed_exactly_once<F: StoreFactory>(factory: &F) {
    const KEYS: usize = 40;
    const TASKS: usize = 16;
    let (ctx, store) = setup(factory, "redelivered_keys_are_completed_exactly_once").await;
    let keys: Arc<Vec<Key>> = Arc::new((0..KEYS).map(|i| key(&format!("m{i}"))).collect());
    // Delivery j is key j / 3; task t handles deliveries t, t + 16, ...: the three
    // deliveries of a key run on three neighbouring tasks at about the same time.
    let deliveries: Vec<usize> = (0..KEYS * 3).map(|j| j / 3).collect();
    let acquired: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let winners = race(factory, &ctx, TASKS, |t, store| {
        let mine: Vec<usize> = deliveries.iter().copied().skip(t).step_by(TASKS).collect();
        let (keys, acquired) = (keys.clone(), acquired.clone());
        async move {
            let mut won = Vec::new();
            for i in mine {
                let lease = match store.claim(&keys[i], &opts()).await {
                    Ok(Claim::Acquired(lease)) => lease,
                    Ok(_) => continue,
                    Err(e) => panic!("claim of {} failed under concurrency: {e:?}", keys[i]),
                };
                acquired[i].fetch_add(1, Ordering::SeqCst);
                let outcome = format!("task {t}");
                store
                    .commit(&lease, Some(outcome.as_bytes()))
                    .await
                    .unwrap_or_else(|e| panic!("commit of {} failed: {e:?}", keys[i]));
                won.push((lease, outcome));
            }
            won
        }
    })
    .await;
    for (i, count) in acquired.iter().enumerate() {
        assert_eq!(
            count.load(Ordering::SeqCst),
            1,
            "{} must be acquired exactly once",
            keys[i]
        );
    }
    for (lease, outcome) in winners.into_iter().flatten() {
        let processed_at = ctx.now();
        assert_completed_by(&store, &lease, processed_at, Some(outcome.as_bytes())).await;
    }
}

/// 8 tasks on 4 handles each `claim_many` the same 20 keys (each in its own rotated
/// order) at once: every key is acquired by exactly one item of one batch, every other
/// item is `InFlight`, and nothing fails.
pub async fn concurrent_batches_acquire_each_key_once<F: StoreFactory>(factory: &F) {
    const KEYS: usize = 20;
    let (ctx, store) = setup(factory, "concurrent_batches_acquire_each_key_once").await;
    let keys: Vec<Key> = (0..KEYS).map(|i| key(&format!("m{i}"))).collect();
    let batches = race(factory, &ctx, 8, |t, store| {
        let requests: Vec<ClaimRequest> = (0..KEYS)
            .map(|j| ClaimRequest::new(keys[(j + t * 3) % KEYS].clone(), opts()))
            .collect();
        async move {
            let results = store
                .claim_many(&requests)
                .await
                .unwrap_or_else(|e| panic!("claim_many failed under concurrency: {e:?}"));
            requests.into_iter().zip(results).collect::<Vec<_>>()
        }
    })
    .await;
    for k in &keys {
        let results = batches
            .iter()
            .flatten()
            .filter(|(req, _)| &req.key == k)
            .map(|(_, r)| Seen::claim(r))
            .collect::<Vec<_>>();
        let wins = results
            .iter()
            .filter(|s| matches!(s, Seen::Lease { fence: 1, .. }))
            .count();
        assert_eq!(wins, 1, "{k}: exactly one batch item acquires: {results:?}");
        assert!(
            results
                .iter()
                .all(|s| matches!(s, Seen::Lease { .. } | Seen::InFlight { attempt: 1, .. })),
            "{k}: the other items see it in flight: {results:?}"
        );
        assert!(record(&store, k).await.is_some());
    }
}

/// A stale owner's commit racing a takeover of its expired lease, on 32 keys at once: for
/// each key exactly one wins. Either the commit succeeded and the claim saw `Completed`,
/// or the claim took over (fence 2) and the commit is `LeaseLost`; never both.
pub async fn a_commit_racing_a_takeover_has_one_winner<F: StoreFactory>(factory: &F) {
    const KEYS: usize = 32;
    let (ctx, store) = setup(factory, "a_commit_racing_a_takeover_has_one_winner").await;
    let mut leases = Vec::with_capacity(KEYS);
    for i in 0..KEYS {
        leases.push(acquire(&store, &key(&format!("m{i}"))).await);
    }
    ctx.clock.advance(LEASE);
    let leases = Arc::new(leases);
    let results = race(factory, &ctx, KEYS * 2, |t, store| {
        let lease = leases[t / 2].clone();
        async move {
            if t % 2 == 0 {
                Seen::unit(&store.commit(&lease, Some(b"stale owner")).await)
            } else {
                Seen::claim(&store.claim(&lease.key, &opts()).await)
            }
        }
    })
    .await;
    for (lease, pair) in leases.iter().zip(results.chunks(2)) {
        let (commit, claimed) = (&pair[0], &pair[1]);
        let commit_won = Seen::Completed {
            processed_at: ctx.now(),
            outcome: Some(b"stale owner".to_vec()),
        };
        match commit {
            Seen::Done => {
                assert_eq!(claimed, &commit_won, "{}: the commit won", lease.key);
                assert_completed_by(&store, lease, ctx.now(), Some(b"stale owner")).await;
            }
            Seen::LeaseLost(_) => {
                assert!(
                    matches!(
                        claimed,
                        Seen::Lease {
                            fence: 2,
                            attempt: 2,
                            ..
                        }
                    ),
                    "{}: the commit lost, so the claim must have taken over: {claimed:?}",
                    lease.key
                );
                let (token, ..) = in_flight(&store, &lease.key).await;
                assert_ne!(token, lease.token, "{}: the new owner holds it", lease.key);
            }
            other => panic!(
                "{}: commit must be Ok or LeaseLost, got {other:?}",
                lease.key
            ),
        }
    }
}
