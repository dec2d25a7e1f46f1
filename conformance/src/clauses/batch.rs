//! Batches: `claim_many` / `commit_many` mean the single operations applied in order, a
//! key repeated inside one batch included.

use std::time::Duration;

use dedup_core::{
    Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Key, Lease, MAX_BATCH_LEN,
};

use crate::StoreFactory;
use crate::support::{
    LEASE, Seen, acquire, acquire_with, assert_completed_by, assert_holds, complete,
    expect_acquired, forged_lease, key, opts, opts_fp, record, setup, taken_over, unchanged,
};

/// `claim_many` that must not fail as a whole and must answer every request.
pub(crate) async fn claim_many<S: DedupStore + ?Sized>(
    store: &S,
    requests: &[ClaimRequest],
) -> Vec<dedup_core::Result<Claim>> {
    let results = store
        .claim_many(requests)
        .await
        .unwrap_or_else(|e| panic!("claim_many failed as a whole: {e:?}"));
    assert_eq!(results.len(), requests.len(), "one result per request");
    results
}

/// `commit_many` that must not fail as a whole and must answer every request.
async fn commit_many<S: DedupStore + ?Sized>(store: &S, requests: &[CommitRequest]) -> Vec<Seen> {
    let results = store
        .commit_many(requests)
        .await
        .unwrap_or_else(|e| panic!("commit_many failed as a whole: {e:?}"));
    assert_eq!(results.len(), requests.len(), "one result per request");
    results.iter().map(Seen::unit).collect()
}

fn seen_claims(results: &[dedup_core::Result<Claim>]) -> Vec<Seen> {
    results.iter().map(Seen::claim).collect()
}

fn req(k: &Key, options: ClaimOptions) -> ClaimRequest {
    ClaimRequest::new(k.clone(), options)
}

fn commit_req(lease: &Lease, outcome: Option<&[u8]>) -> CommitRequest {
    CommitRequest {
        lease: lease.clone(),
        outcome: outcome.map(<[u8]>::to_vec),
    }
}

/// The lease a batch item must have acquired.
fn item_lease(results: &[dedup_core::Result<Claim>], i: usize) -> Lease {
    match &results[i] {
        Ok(claim) => expect_acquired(claim.clone(), &format!("batch item {i}")),
        Err(e) => panic!("batch item {i}: expected Acquired, got {e:?}"),
    }
}

fn acquired(k: &Key, fence: u64, attempt: u32, expires_at: dedup_core::Timestamp) -> Seen {
    Seen::Lease {
        key: k.clone(),
        fence,
        attempt,
        expires_at,
    }
}

/// `claim_many` over an absent key, a live lease, a completed key, an expired lease, a
/// fingerprint mismatch and repeats answers exactly what the single claims in order would,
/// and leaves the records they would.
pub async fn claim_many_equals_the_claims_in_order<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "claim_many_equals_the_claims_in_order").await;
    let [new, live, done, exp, fp] = ["new", "live", "done", "exp", "fp"].map(key);
    let live_lease = acquire(&store, &live).await;
    complete(&store, &done, Some(b"o")).await;
    let done_at = ctx.now();
    acquire_with(&store, &exp, &ClaimOptions::lease(Duration::from_secs(1))).await;
    acquire_with(&store, &fp, &opts_fp("v1")).await;
    ctx.clock.advance(Duration::from_secs(2));
    let fp_before = record(&store, &fp).await;

    let requests = [
        req(&new, opts()),
        req(&live, opts()),
        req(&done, opts()),
        req(&exp, opts()),
        req(&fp, opts_fp("v2")),
        req(&new, opts()),
        req(&exp, opts()),
    ];
    let results = claim_many(&store, &requests).await;
    let until = ctx.now().saturating_add(LEASE);
    assert_eq!(
        seen_claims(&results),
        vec![
            acquired(&new, 1, 1, until),
            Seen::InFlight {
                expires_at: live_lease.expires_at,
                attempt: 1
            },
            Seen::Completed {
                processed_at: done_at,
                outcome: Some(b"o".to_vec())
            },
            acquired(&exp, 2, 2, until),
            Seen::Mismatch(fp.clone()),
            Seen::InFlight {
                expires_at: until,
                attempt: 1
            },
            Seen::InFlight {
                expires_at: until,
                attempt: 2
            },
        ],
        "claim_many must answer like the claims in order"
    );
    assert_holds(&store, &item_lease(&results, 0), "the new key").await;
    assert_holds(&store, &item_lease(&results, 3), "the taken-over key").await;
    assert_eq!(
        record(&store, &fp).await,
        fp_before,
        "a mismatched item changes nothing"
    );
}

/// `commit_many` over valid, stale, unknown and repeated leases answers exactly what the
/// single commits in order would, and leaves the records they would.
pub async fn commit_many_equals_the_commits_in_order<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "commit_many_equals_the_commits_in_order").await;
    let [a, b, c, d] = ["a", "b", "c", "d"].map(key);
    let lease_a = acquire(&store, &a).await;
    let lease_c = acquire(&store, &c).await;
    let (stale_b, current_b) = taken_over(&store, &ctx, &b).await;
    let requests = [
        commit_req(&lease_a, Some(b"A")),
        commit_req(&stale_b, Some(b"B")),
        commit_req(&lease_c, None),
        commit_req(&lease_a, Some(b"A2")),
        commit_req(&forged_lease(&d, ctx.now()), Some(b"D")),
        commit_req(&current_b, Some(b"B2")),
        commit_req(&stale_b, Some(b"B3")),
    ];
    assert_eq!(
        commit_many(&store, &requests).await,
        vec![
            Seen::Done,
            Seen::LeaseLost(b.clone()),
            Seen::Done,
            Seen::Done,
            Seen::LeaseLost(d.clone()),
            Seen::Done,
            Seen::LeaseLost(b.clone()),
        ],
        "commit_many must answer like the commits in order"
    );
    let now = ctx.now();
    assert_completed_by(&store, &lease_a, now, Some(b"A")).await;
    assert_completed_by(&store, &current_b, now, Some(b"B2")).await;
    assert_completed_by(&store, &lease_c, now, None).await;
    assert_eq!(
        record(&store, &d).await,
        None,
        "an unknown lease writes nothing"
    );
}

/// A key repeated inside one batch behaves as it would in order: only the first claim
/// acquires (the others see its lease in flight), a second fingerprint mismatches the one
/// the first stored, two commits of one lease keep the first outcome, and a batch of
/// claims of a completed key gives `Completed` for each.
pub async fn a_key_repeated_in_one_batch_behaves_as_in_order<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "a_key_repeated_in_one_batch_behaves_as_in_order").await;
    let [k, f, t] = ["k", "f", "t"].map(key);
    let results = claim_many(&store, &[req(&k, opts()), req(&k, opts()), req(&k, opts())]).await;
    let until = ctx.now().saturating_add(LEASE);
    let in_flight = Seen::InFlight {
        expires_at: until,
        attempt: 1,
    };
    assert_eq!(
        seen_claims(&results),
        vec![acquired(&k, 1, 1, until), in_flight.clone(), in_flight],
        "one key three times in one claim_many"
    );
    let lease = item_lease(&results, 0);
    assert_holds(&store, &lease, "after the repeated claims").await;

    let results = claim_many(
        &store,
        &[
            req(&f, opts_fp("v1")),
            req(&f, opts_fp("v2")),
            req(&f, opts()),
        ],
    )
    .await;
    assert_eq!(
        seen_claims(&results),
        vec![
            acquired(&f, 1, 1, until),
            Seen::Mismatch(f.clone()),
            Seen::InFlight {
                expires_at: until,
                attempt: 1
            }
        ],
        "one key with two fingerprints in one claim_many"
    );

    acquire_with(&store, &t, &ClaimOptions::lease(Duration::from_secs(1))).await;
    ctx.clock.advance(Duration::from_secs(1));
    let results = claim_many(&store, &[req(&t, opts()), req(&t, opts())]).await;
    let until = ctx.now().saturating_add(LEASE);
    assert_eq!(
        seen_claims(&results),
        vec![
            acquired(&t, 2, 2, until),
            Seen::InFlight {
                expires_at: until,
                attempt: 2
            }
        ],
        "an expired key twice in one claim_many: one takeover"
    );

    let commits = [
        commit_req(&lease, Some(b"x")),
        commit_req(&lease, Some(b"y")),
    ];
    assert_eq!(
        commit_many(&store, &commits).await,
        vec![Seen::Done, Seen::Done],
        "one lease committed twice in one commit_many"
    );
    assert_completed_by(&store, &lease, ctx.now(), Some(b"x")).await;
    let done = Seen::Completed {
        processed_at: ctx.now(),
        outcome: Some(b"x".to_vec()),
    };
    let results = unchanged(
        &store,
        &k,
        "claims of a completed key",
        claim_many(&store, &[req(&k, opts()), req(&k, opts())]),
    )
    .await;
    assert_eq!(seen_claims(&results), vec![done.clone(), done]);
}

/// Empty batches are answered with empty results, and a batch of `MAX_BATCH_LEN` distinct
/// keys is accepted: every key acquired in request order, committed, and its outcome
/// returned by the next batch.
pub async fn empty_and_full_batches_are_accepted<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "empty_and_full_batches_are_accepted").await;
    assert!(claim_many(&store, &[]).await.is_empty());
    assert!(commit_many(&store, &[]).await.is_empty());
    let keys: Vec<Key> = (0..MAX_BATCH_LEN).map(|i| key(&format!("m{i}"))).collect();
    let requests: Vec<ClaimRequest> = keys.iter().map(|k| req(k, opts())).collect();
    let results = claim_many(&store, &requests).await;
    let until = ctx.now().saturating_add(LEASE);
    let commits: Vec<CommitRequest> = (0..keys.len())
        .map(|i| {
            let lease = item_lease(&results, i);
            assert_eq!(Seen::lease(&lease), acquired(&keys[i], 1, 1, until));
            commit_req(&lease, Some(i.to_string().as_bytes()))
        })
        .collect();
    assert!(
        commit_many(&store, &commits)
            .await
            .iter()
            .all(|s| *s == Seen::Done),
        "every commit of a full batch succeeds"
    );
    let again = claim_many(&store, &requests).await;
    for (i, result) in again.iter().enumerate() {
        assert_eq!(
            Seen::claim(result),
            Seen::Completed {
                processed_at: ctx.now(),
                outcome: Some(i.to_string().into_bytes())
            },
            "item {i} of the second full batch"
        );
    }
}
