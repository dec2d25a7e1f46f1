//! Claim: acquire, in flight, takeover, consumers, keys, and what `get` reports.

use std::time::Duration;

use dedup_core::{Claim, DedupStore, Key, Record, RecordState};

use crate::StoreFactory;
use crate::support::{
    LEASE, acquire, acquire_with, assert_holds, claim, commit_ok, complete, completed,
    expect_acquired, fingerprint, key, key_for, opts, opts_fp, record, release_ok, setup,
    unchanged,
};

/// The first claim of an absent key acquires a lease with fence 1, attempt 1, expiring
/// `LEASE` after now, and `get` shows it in flight with that token.
pub async fn first_claim_acquires<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "first_claim_acquires").await;
    let k = key("m1");
    let lease = expect_acquired(claim(&store, &k, &opts()).await, "first claim");
    assert_eq!(
        (lease.fence, lease.attempt),
        (1, 1),
        "fence and attempt of a first claim"
    );
    assert_eq!(lease.key, k, "the lease names its key");
    assert_eq!(
        lease.expires_at,
        ctx.now().saturating_add(LEASE),
        "expiry = now + lease"
    );
    assert_holds(&store, &lease, "after the first claim").await;
}

/// A claim while another lease is live returns `InFlight` with that lease's expiry and
/// attempt, and changes nothing, up to the last millisecond of the lease.
pub async fn live_lease_gives_in_flight<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "live_lease_gives_in_flight").await;
    let k = key("m1");
    let lease = acquire(&store, &k).await;
    for step in [Duration::ZERO, LEASE - Duration::from_millis(1)] {
        ctx.clock.advance(step);
        let second = unchanged(
            &store,
            &k,
            "a claim of a live lease",
            claim(&store, &k, &opts()),
        )
        .await;
        assert_eq!(
            second,
            Claim::InFlight {
                expires_at: lease.expires_at,
                attempt: 1
            },
            "a live lease must give InFlight (clock advanced {step:?})"
        );
    }
}

/// Once the lease expired (now >= expires_at, to the millisecond), a claim takes the key
/// over: a new token, fence and attempt one higher each time, expiring `LEASE` after now.
pub async fn expired_lease_is_taken_over<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "expired_lease_is_taken_over").await;
    let k = key("m1");
    let mut previous = acquire(&store, &k).await;
    for n in 2..=4u32 {
        ctx.clock.advance(LEASE);
        let next = expect_acquired(
            claim(&store, &k, &opts()).await,
            "a claim at the exact expiry",
        );
        assert_ne!(next.token, previous.token, "a takeover gets a new token");
        assert_eq!(
            (next.fence, next.attempt),
            (u64::from(n), n),
            "takeover: fence+1, attempt+1"
        );
        assert_eq!(next.expires_at, ctx.now().saturating_add(LEASE));
        assert_holds(&store, &next, "after a takeover").await;
        previous = next;
    }
}

/// Idempotency is per consumer: two consumers claiming the same message id each get their
/// own lease, and committing, releasing or taking over one never affects the other.
pub async fn consumers_are_isolated<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "consumers_are_isolated").await;
    let billing = key_for("billing", "order-7");
    let notify = key_for("notification", "order-7");
    let b = acquire(&store, &billing).await;
    let n = acquire(&store, &notify).await;
    assert_eq!(
        (n.fence, n.attempt),
        (1, 1),
        "the second consumer starts fresh"
    );
    commit_ok(&store, &b, Some(b"billed")).await;
    let committed_at = ctx.now();
    assert_holds(&store, &n, "the other consumer's commit").await;
    release_ok(&store, &n).await;
    assert_eq!(
        claim(&store, &billing, &opts()).await,
        completed(committed_at, Some(b"billed")),
        "the other consumer's release must not reopen this key"
    );
    let again = acquire(&store, &notify).await;
    assert_eq!((again.fence, again.attempt), (2, 2));
}

/// Keys are compared byte for byte: ids that a naive encoding would confuse (a separator
/// inside a part, case, trailing space, Unicode normalisation, glob and LIKE
/// metacharacters, Redis hash tags) are all distinct keys.
pub async fn keys_are_distinct_byte_for_byte<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "keys_are_distinct_byte_for_byte").await;
    let keys: Vec<Key> = [
        ("a:b", "c"),
        ("a", "b:c"),
        ("a", "b/c"),
        ("a/b", "c"),
        ("x", "m"),
        ("x", "M"),
        ("x", "m "),
        ("x", " m"),
        ("x", "\u{fc}"),
        ("x", "u\u{308}"),
        ("x", "*"),
        ("x", "%"),
        ("x", "_"),
        ("x", "?"),
        ("x", "[m]"),
        ("{tag}", "1"),
        ("{tag}", "2"),
        ("x", "\u{1}"),
        ("x", "'; drop table x; --"),
    ]
    .iter()
    .map(|(c, m)| key_for(c, m))
    .collect();
    for (i, k) in keys.iter().enumerate() {
        let lease = acquire(&store, k).await;
        assert_eq!((lease.fence, lease.attempt), (1, 1), "{k:?} collided");
        commit_ok(&store, &lease, Some(i.to_string().as_bytes())).await;
    }
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            claim(&store, k, &opts()).await,
            completed(ctx.now(), Some(i.to_string().as_bytes())),
            "{k:?} must keep its own outcome"
        );
    }
}

/// Keys at the size limits (a 200-byte consumer, a 255-byte message id of multi-byte
/// characters) are stored and read back exactly.
pub async fn keys_at_the_size_limits_round_trip<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "keys_at_the_size_limits_round_trip").await;
    let consumer = "c".repeat(Key::MAX_CONSUMER_LEN);
    let message_id = format!("{}x", "\u{e9}".repeat(127));
    assert_eq!(message_id.len(), Key::MAX_MESSAGE_ID_LEN);
    let k = key_for(&consumer, &message_id);
    let lease = complete(&store, &k, Some(b"ok")).await;
    let rec = record(&store, &k).await.expect("record of a long key");
    assert_eq!(rec.key, k, "get must return the key byte for byte");
    assert_eq!(lease.key, k);
    assert_eq!(
        claim(&store, &k, &opts()).await,
        completed(ctx.now(), Some(b"ok"))
    );
}

/// `get` reports the record faithfully in every state: absent (`None`), in flight (token,
/// expiry, fence, attempt, fingerprint), taken over, released, completed (committing token,
/// processed_at, outcome), and a completed record never expires.
pub async fn get_reports_the_record_faithfully<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "get_reports_the_record_faithfully").await;
    let k = key("m1");
    assert_eq!(
        record(&store, &k).await,
        None,
        "an absent key has no record"
    );
    let fp = fingerprint("v1");
    // Kept from the first claim on, through takeover, release and commit, where the
    // backend keeps it.
    let first_claimed_at = store.capabilities().first_claim_time.then_some(ctx.now());
    let first = acquire_with(&store, &k, &opts_fp("v1")).await;
    let expect = |fence, attempt, state| Record {
        key: k.clone(),
        fence,
        attempt,
        fingerprint: Some(fp.clone()),
        first_claimed_at,
        last_failure: None,
        state,
    };
    let first_record = Some(expect(
        1,
        1,
        RecordState::InFlight {
            token: first.token,
            expires_at: first.expires_at,
        },
    ));
    assert_eq!(
        record(&store, &k).await,
        first_record,
        "in flight after the first claim"
    );
    ctx.clock.advance(LEASE * 2);
    assert_eq!(
        record(&store, &k).await,
        first_record,
        "get reports an expired lease as stored (it does not hide it)"
    );
    let second = acquire_with(&store, &k, &opts()).await;
    ctx.clock.advance(Duration::from_millis(1500));
    release_ok(&store, &second).await;
    let released_at = ctx.now();
    assert_eq!(
        record(&store, &k).await,
        Some(expect(
            2,
            2,
            RecordState::InFlight {
                token: second.token,
                expires_at: released_at
            }
        )),
        "released: expires now; the takeover without a fingerprint kept the stored one"
    );
    ctx.clock.advance(Duration::from_millis(250));
    commit_ok(&store, &second, Some(b"\x00out")).await;
    let done = Some(expect(
        2,
        2,
        RecordState::Completed {
            token: Some(second.token),
            processed_at: ctx.now(),
            outcome: Some(b"\x00out".to_vec()),
        },
    ));
    assert_eq!(record(&store, &k).await, done, "completed");
    ctx.clock.advance(LEASE * 100);
    assert_eq!(
        record(&store, &k).await,
        done,
        "a completed record never expires"
    );
}
