//! Outcomes (byte-for-byte round trips) and fingerprints (mismatch is an error in every
//! state and changes nothing).

use dedup_core::{Claim, DedupStore, Fingerprint, Key, MAX_FINGERPRINT_LEN, MAX_OUTCOME_LEN};

use crate::StoreFactory;
use crate::support::{
    LEASE, acquire_with, assert_fingerprint_mismatch, claim, commit_ok, complete, completed,
    expect_acquired, fingerprint, key, opts, opts_fp, record, release_ok, setup, unchanged,
};

/// Outcomes round-trip exactly: no outcome (`None`) and an empty one (`Some([])`) stay
/// different, binary bytes (every byte value, NUL, invalid UTF-8) and an outcome of
/// exactly `MAX_OUTCOME_LEN` bytes come back byte for byte from claim and from `get`.
pub async fn completed_key_gives_its_outcome_byte_for_byte<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "completed_key_gives_its_outcome_byte_for_byte").await;
    let every_byte: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let large: Vec<u8> = (0..MAX_OUTCOME_LEN).map(|i| (i * 31 % 251) as u8).collect();
    let outcomes: [Option<&[u8]>; 6] = [
        None,
        Some(b""),
        Some(b"\0"),
        Some(&[0xff, 0xfe, 0x00, 0xc3]),
        Some(&every_byte),
        Some(&large),
    ];
    for (i, outcome) in outcomes.iter().enumerate() {
        let k = key(&format!("o{i}"));
        complete(&store, &k, *outcome).await;
        assert_eq!(
            claim(&store, &k, &opts()).await,
            completed(ctx.now(), *outcome),
            "outcome {i} as claim returns it"
        );
        match record(&store, &k).await.map(|r| r.state) {
            Some(dedup_core::RecordState::Completed { outcome: got, .. }) => {
                assert_eq!(got.as_deref(), *outcome, "outcome {i} as get returns it")
            }
            other => panic!("{k} must be completed, got {other:?}"),
        }
    }
}

/// Claim `k` with fingerprint `fp`; it must mismatch and change nothing.
async fn mismatch<S: DedupStore + ?Sized>(store: &S, k: &Key, fp: &str, state: &str) {
    let result = unchanged(store, k, "a mismatched claim", store.claim(k, &opts_fp(fp))).await;
    assert_fingerprint_mismatch(result, k, state);
}

/// A claim whose fingerprint differs from the stored one is `FingerprintMismatch` and
/// changes nothing, whether the record is in flight (live), expired (no takeover
/// happens), released or completed; the matching fingerprint keeps working throughout.
pub async fn fingerprint_mismatch_is_an_error_in_every_state<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "fingerprint_mismatch_is_an_error_in_every_state").await;
    let k = key("m1");
    let lease = acquire_with(&store, &k, &opts_fp("v1")).await;
    mismatch(&store, &k, "v2", "a live lease").await;
    assert!(matches!(
        claim(&store, &k, &opts_fp("v1")).await,
        Claim::InFlight { .. }
    ));
    ctx.clock.advance(LEASE);
    mismatch(&store, &k, "v2", "an expired lease").await;
    release_ok(&store, &lease).await;
    mismatch(&store, &k, "v2", "a released lease").await;
    let taken = acquire_with(&store, &k, &opts_fp("v1")).await;
    assert_eq!((taken.fence, taken.attempt), (2, 2));
    commit_ok(&store, &taken, Some(b"r")).await;
    mismatch(&store, &k, "v2", "a completed key").await;
    assert_eq!(
        claim(&store, &k, &opts_fp("v1")).await,
        completed(ctx.now(), Some(b"r"))
    );
}

/// A claim without a fingerprint never mismatches, and a claim with one on a record that
/// has none does not mismatch either (and stores it only if it acquires). A takeover
/// stores the claim's fingerprint when it has one and keeps the stored one otherwise.
pub async fn a_takeover_stores_the_claims_fingerprint_or_keeps_the_stored_one<F: StoreFactory>(
    factory: &F,
) {
    let (ctx, store) = setup(
        factory,
        "a_takeover_stores_the_claims_fingerprint_or_keeps_the_stored_one",
    )
    .await;
    let stored = |k: Key| {
        let store = &store;
        async move { record(store, &k).await.and_then(|r| r.fingerprint) }
    };
    let k = key("m1");
    acquire_with(&store, &k, &opts()).await;
    assert!(matches!(
        claim(&store, &k, &opts_fp("v1")).await,
        Claim::InFlight { .. }
    ));
    assert_eq!(
        stored(k.clone()).await,
        None,
        "InFlight stores no fingerprint"
    );
    ctx.clock.advance(LEASE);
    acquire_with(&store, &k, &opts_fp("v1")).await;
    assert_eq!(stored(k.clone()).await, Some(fingerprint("v1")));
    assert!(matches!(
        claim(&store, &k, &opts()).await,
        Claim::InFlight { .. }
    ));
    ctx.clock.advance(LEASE);
    let third = expect_acquired(claim(&store, &k, &opts()).await, "takeover without one");
    assert_eq!(
        stored(k.clone()).await,
        Some(fingerprint("v1")),
        "a takeover without a fingerprint keeps the stored one"
    );
    assert_eq!((third.fence, third.attempt), (3, 3));
    let plain = key("m2");
    complete(&store, &plain, None).await;
    assert!(
        matches!(
            claim(&store, &plain, &opts_fp("v9")).await,
            Claim::Completed { .. }
        ),
        "a record without a fingerprint never mismatches"
    );
}

/// Fingerprints are stored exactly: the longest allowed, multi-byte text, and a payload
/// hash come back from `get` as given.
pub async fn fingerprints_round_trip_exactly<F: StoreFactory>(factory: &F) {
    let (_ctx, store) = setup(factory, "fingerprints_round_trip_exactly").await;
    let fps = [
        Fingerprint::new("f".repeat(MAX_FINGERPRINT_LEN)).expect("longest fingerprint"),
        Fingerprint::new("v\u{e9}rsion:1 {x}").expect("text fingerprint"),
        Fingerprint::of_payload(b"{\"amount\": 42}"),
    ];
    for (i, fp) in fps.iter().enumerate() {
        let k = key(&format!("f{i}"));
        acquire_with(&store, &k, &opts().with_fingerprint(fp.clone())).await;
        assert_eq!(
            record(&store, &k)
                .await
                .and_then(|r| r.fingerprint)
                .as_ref(),
            Some(fp),
            "fingerprint {i}"
        );
    }
}
