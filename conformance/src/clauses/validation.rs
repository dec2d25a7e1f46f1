//! Input validation: invalid input is `InvalidInput`, checked before anything is written.
//!
//! Keys cannot be invalid here ([`Key`](dedup_core::Key) validates on construction); what a
//! store receives and must still check is lease and renewal durations, outcome sizes, batch
//! lengths and purge options, and, in its constructor, the table, schema or key-prefix
//! name (through the factory's optional [`StoreFactory::open_named`]).

use std::time::Duration;

use dedup_core::{
    ClaimOptions, ClaimRequest, CommitRequest, DedupStore, MAX_BATCH_LEN, MAX_LEASE,
    MAX_OUTCOME_LEN, MIN_LEASE, PurgeOptions,
};

use crate::StoreFactory;
use crate::support::{
    LEASE, acquire, acquire_with, assert_holds, assert_invalid_input, commit_ok, complete, key,
    opts, record, setup, unchanged,
};

fn too_long_lease() -> Duration {
    MAX_LEASE + Duration::from_millis(1)
}

/// A claim with a lease outside `MIN_LEASE..=MAX_LEASE` (zero, or a millisecond over the
/// maximum) is `InvalidInput` and creates no record; the limits themselves are accepted.
/// A renewal outside the limits is rejected the same way and leaves the lease as it was.
pub async fn invalid_lease_is_rejected_before_anything_is_written<F: StoreFactory>(factory: &F) {
    let (_ctx, store) = setup(
        factory,
        "invalid_lease_is_rejected_before_anything_is_written",
    )
    .await;
    let k = key("m1");
    for lease in [Duration::ZERO, too_long_lease()] {
        let result = store.claim(&k, &ClaimOptions::lease(lease)).await;
        assert_invalid_input(result, &format!("claim with a {lease:?} lease"));
        assert_eq!(
            record(&store, &k).await,
            None,
            "a rejected claim wrote a record"
        );
    }
    acquire_with(&store, &key("min"), &ClaimOptions::lease(MIN_LEASE)).await;
    let held = acquire_with(&store, &key("max"), &ClaimOptions::lease(MAX_LEASE)).await;
    for extend_by in [Duration::ZERO, too_long_lease()] {
        let result = unchanged(
            &store,
            &held.key,
            "a rejected renew",
            store.renew(&held, extend_by),
        )
        .await;
        assert_invalid_input(result, &format!("renew by {extend_by:?}"));
    }
}

/// A commit with an outcome over `MAX_OUTCOME_LEN` is `InvalidInput` and the lease stays
/// in flight, unchanged; an outcome of exactly `MAX_OUTCOME_LEN` bytes is accepted.
pub async fn oversized_outcome_is_rejected_and_the_lease_stays_in_flight<F: StoreFactory>(
    factory: &F,
) {
    let (_ctx, store) = setup(
        factory,
        "oversized_outcome_is_rejected_and_the_lease_stays_in_flight",
    )
    .await;
    let lease = acquire(&store, &key("m1")).await;
    let too_big = vec![7u8; MAX_OUTCOME_LEN + 1];
    assert_invalid_input(
        store.commit(&lease, Some(&too_big)).await,
        "commit of an oversized outcome",
    );
    assert_holds(&store, &lease, "after a rejected commit").await;
    commit_ok(&store, &lease, Some(&too_big[..MAX_OUTCOME_LEN])).await;
}

/// A batch with one invalid item (a zero lease, an oversized outcome) or with more than
/// `MAX_BATCH_LEN` items fails as a whole with `InvalidInput` and writes nothing, not even
/// the valid items before the invalid one.
pub async fn a_batch_with_one_invalid_item_writes_nothing<F: StoreFactory>(factory: &F) {
    let (_ctx, store) = setup(factory, "a_batch_with_one_invalid_item_writes_nothing").await;
    let [a, b, c] = ["a", "b", "c"].map(key);
    let requests = [
        ClaimRequest::new(a.clone(), opts()),
        ClaimRequest::new(b.clone(), opts()),
        ClaimRequest::new(c.clone(), ClaimOptions::lease(Duration::ZERO)),
    ];
    assert_invalid_input(
        store.claim_many(&requests).await,
        "claim_many with a zero lease in the last item",
    );
    let too_many: Vec<ClaimRequest> = (0..=MAX_BATCH_LEN)
        .map(|i| ClaimRequest::new(key(&format!("n{i}")), opts()))
        .collect();
    assert_invalid_input(
        store.claim_many(&too_many).await,
        "claim_many over MAX_BATCH_LEN",
    );
    for k in [&a, &b, &c, &too_many[0].key] {
        assert_eq!(
            record(&store, k).await,
            None,
            "{k}: a rejected batch wrote it"
        );
    }

    let lease_a = acquire(&store, &a).await;
    let lease_b = acquire(&store, &b).await;
    let commits = [
        CommitRequest {
            lease: lease_a.clone(),
            outcome: Some(b"ok".to_vec()),
        },
        CommitRequest {
            lease: lease_b.clone(),
            outcome: Some(vec![0; MAX_OUTCOME_LEN + 1]),
        },
    ];
    assert_invalid_input(
        store.commit_many(&commits).await,
        "commit_many with an oversized outcome in the last item",
    );
    let too_many: Vec<CommitRequest> = (0..=MAX_BATCH_LEN).map(|_| commits[0].clone()).collect();
    assert_invalid_input(
        store.commit_many(&too_many).await,
        "commit_many over MAX_BATCH_LEN",
    );
    assert_holds(&store, &lease_a, "after rejected commit batches").await;
    assert_holds(&store, &lease_b, "after rejected commit batches").await;
}

/// Purge with a batch size of 0 or over 100 000 is `InvalidInput` and removes nothing.
pub async fn invalid_purge_options_are_rejected<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "invalid_purge_options_are_rejected").await;
    let k = key("old");
    complete(&store, &k, None).await;
    ctx.clock.advance(LEASE * 10);
    for batch_size in [0, 100_001] {
        let options = PurgeOptions::older_than(Duration::ZERO).batch_size(batch_size);
        let result = unchanged(&store, &k, "a rejected purge", store.purge(&options)).await;
        assert_invalid_input(result, &format!("purge with batch size {batch_size}"));
    }
}

/// Names a store builds statements or keys from (table, schema, key prefix) that no
/// backend may accept: each is `InvalidInput` from the store's constructor (through
/// [`StoreFactory::open_named`]; a factory that does not implement it is reported and
/// skipped).
pub async fn unsafe_names_are_rejected<F: StoreFactory>(factory: &F) {
    let ctx = crate::TestContext::new("unsafe_names_are_rejected");
    let long = "n".repeat(101);
    let names = [
        "",
        "x; drop table y",
        "{tag}",
        "p*",
        "p?",
        "p[1]",
        "n\u{e9}",
        "a\0b",
        long.as_str(),
    ];
    for name in names {
        match factory.open_named(&ctx, name).await {
            None => {
                eprintln!("unsafe_names_are_rejected: the factory opens no named stores; skipped");
                return;
            }
            Some(result) => assert_invalid_input(result.map(|_| ()), &format!("name {name:?}")),
        }
    }
}
