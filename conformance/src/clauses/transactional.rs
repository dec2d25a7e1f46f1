//! The transactional contract of SQL backends: a claim inside the caller's transaction
//! commits or rolls back with the caller's business rows; a concurrent transaction on the
//! same key waits for the first; a lease can be committed inside a transaction.
//!
//! The clauses drive the backend through [`TransactionalFactory`]. The two that need two
//! transactions at once run each on its own OS thread (so a backend whose transaction
//! blocks its thread still gets real parallelism); they need the multi-threaded runtime.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dedup_core::{DedupStore, Fingerprint, Key, Record, RecordState, Result, TxClaim};
use futures::future::BoxFuture;

use crate::support::{
    LEASE, acquire, acquire_with, assert_completed_by, assert_fingerprint_mismatch, assert_holds,
    assert_lease_lost, claim, commit_ok, complete, completed, expect_acquired, fingerprint, key,
    opts, opts_fp, record, setup, taken_over, unchanged,
};
use crate::{TransactionalFactory, TxEnd};

/// How long the concurrency clauses keep the first transaction open while the second one
/// must be waiting for it.
pub const TX_HOLD: Duration = Duration::from_millis(200);

fn no_hold() -> BoxFuture<'static, ()> {
    Box::pin(async {})
}

/// `claim_in_transaction` without holding the transaction open.
async fn tx_claim<F: TransactionalFactory>(
    factory: &F,
    store: &F::Store,
    key: &Key,
    fp: Option<&str>,
    label: &str,
    end: TxEnd,
) -> Result<TxClaim> {
    let fp: Option<Fingerprint> = fp.map(fingerprint);
    factory
        .claim_in_transaction(store, key, fp.as_ref(), label, no_hold(), end)
        .await
}

/// The record a transactional claim leaves once committed (first claimed at
/// `processed_at`, where the store keeps that time).
fn tx_completed<S: DedupStore + ?Sized>(
    store: &S,
    key: &Key,
    fence: u64,
    processed_at: dedup_core::Timestamp,
) -> Record {
    Record {
        key: key.clone(),
        fence,
        attempt: fence as u32,
        fingerprint: None,
        first_claimed_at: store
            .capabilities()
            .first_claim_time
            .then_some(processed_at),
        last_failure: None,
        state: RecordState::Completed {
            token: None,
            processed_at,
            outcome: None,
        },
    }
}

async fn assert_rows<F: TransactionalFactory>(
    factory: &F,
    store: &F::Store,
    key: &Key,
    want: &[&str],
    what: &str,
) {
    assert_eq!(
        factory.business_rows(store, key).await,
        want,
        "{what}: business rows of {key}"
    );
}

/// A transactional claim of an absent key is `Claimed { fence: 1 }`; once committed, the
/// business row exists and the key is completed (no token, fence 1, attempt 1, no
/// outcome, processed now, the claim's fingerprint), so a lease-mode claim gets
/// `Completed`.
pub async fn tx_claim_then_commit_completes_the_key_with_its_business_row<
    F: TransactionalFactory,
>(
    factory: &F,
) {
    let (ctx, store) = setup(
        factory,
        "tx_claim_then_commit_completes_the_key_with_its_business_row",
    )
    .await;
    let k = key("m1");
    let result = tx_claim(factory, &store, &k, Some("v1"), "row", TxEnd::Commit).await;
    assert_eq!(result.expect("tx claim"), TxClaim::Claimed { fence: 1 });
    assert_rows(factory, &store, &k, &["row"], "after commit").await;
    assert_eq!(
        record(&store, &k).await,
        Some(Record {
            fingerprint: Some(fingerprint("v1")),
            ..tx_completed(&store, &k, 1, ctx.now())
        })
    );
    assert_eq!(claim(&store, &k, &opts()).await, completed(ctx.now(), None));
}

/// A rolled-back transactional claim leaves no record and no business row, and the next
/// lease-mode claim acquires at once with fence 1.
pub async fn tx_rollback_leaves_no_record_and_no_business_row<F: TransactionalFactory>(
    factory: &F,
) {
    let (_ctx, store) = setup(factory, "tx_rollback_leaves_no_record_and_no_business_row").await;
    let k = key("m1");
    let result = tx_claim(factory, &store, &k, None, "row", TxEnd::Rollback).await;
    assert_eq!(result.expect("tx claim"), TxClaim::Claimed { fence: 1 });
    assert_eq!(
        record(&store, &k).await,
        None,
        "rollback must leave no record"
    );
    assert_rows(factory, &store, &k, &[], "after rollback").await;
    let lease = acquire(&store, &k).await;
    assert_eq!((lease.fence, lease.attempt), (1, 1));
}

/// A transactional claim of a completed key (by a transaction or a lease-mode commit) is
/// `Completed` with the stored outcome, writes no business row, and the caller's
/// transaction stays usable (the factory's next statement and commit succeed).
pub async fn tx_claim_of_a_completed_key_gives_completed_and_the_transaction_stays_usable<
    F: TransactionalFactory,
>(
    factory: &F,
) {
    let (ctx, store) = setup(
        factory,
        "tx_claim_of_a_completed_key_gives_completed_and_the_transaction_stays_usable",
    )
    .await;
    let k = key("by-tx");
    tx_claim(factory, &store, &k, None, "first", TxEnd::Commit)
        .await
        .expect("first tx claim");
    let done_at = ctx.now();
    ctx.clock.advance(Duration::from_secs(1));
    let again = tx_claim(factory, &store, &k, None, "dup", TxEnd::Commit).await;
    assert_eq!(
        again.expect("a duplicate must not fail the transaction"),
        TxClaim::Completed {
            processed_at: done_at,
            outcome: None
        }
    );
    assert_rows(factory, &store, &k, &["first"], "after a duplicate").await;

    let leased = key("by-lease");
    complete(&store, &leased, Some(b"o")).await;
    let dup = unchanged(
        &store,
        &leased,
        "a duplicate tx claim",
        tx_claim(factory, &store, &leased, None, "dup", TxEnd::Commit),
    )
    .await;
    assert_eq!(
        dup.expect("tx claim of a lease-completed key"),
        TxClaim::Completed {
            processed_at: ctx.now(),
            outcome: Some(b"o".to_vec())
        }
    );
    assert_rows(factory, &store, &leased, &[], "after a duplicate").await;
}

/// A transactional claim of a key under a live lease-mode lease is `InFlight` with that
/// lease's expiry and attempt, writes nothing, and leaves the lease usable.
pub async fn tx_claim_of_a_live_lease_gives_in_flight<F: TransactionalFactory>(factory: &F) {
    let (_ctx, store) = setup(factory, "tx_claim_of_a_live_lease_gives_in_flight").await;
    let k = key("m1");
    let lease = acquire(&store, &k).await;
    let result = unchanged(
        &store,
        &k,
        "a tx claim of a live lease",
        tx_claim(factory, &store, &k, None, "row", TxEnd::Commit),
    )
    .await;
    assert_eq!(
        result.expect("tx claim"),
        TxClaim::InFlight {
            expires_at: lease.expires_at,
            attempt: 1
        }
    );
    assert_rows(factory, &store, &k, &[], "after InFlight").await;
    commit_ok(&store, &lease, None).await;
}

/// A transactional claim of a key whose lease expired takes it over: `Claimed { fence: 2 }`,
/// the record becomes completed with fence 2 and attempt 2 (keeping the stored
/// fingerprint), and the old lease's commit is `LeaseLost`.
pub async fn tx_claim_takes_over_an_expired_lease<F: TransactionalFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "tx_claim_takes_over_an_expired_lease").await;
    let k = key("m1");
    let claimed_at = ctx.now();
    let stale = acquire_with(&store, &k, &opts_fp("v1")).await;
    ctx.clock.advance(LEASE);
    let result = tx_claim(factory, &store, &k, None, "row", TxEnd::Commit).await;
    assert_eq!(result.expect("tx claim"), TxClaim::Claimed { fence: 2 });
    assert_rows(factory, &store, &k, &["row"], "after a takeover").await;
    let taken = Record {
        fingerprint: Some(fingerprint("v1")),
        // The lease-mode claim's time, kept by the takeover.
        first_claimed_at: store.capabilities().first_claim_time.then_some(claimed_at),
        ..tx_completed(&store, &k, 2, ctx.now())
    };
    assert_eq!(record(&store, &k).await, Some(taken));
    let lost = unchanged(&store, &k, "a stale commit", store.commit(&stale, None)).await;
    assert_lease_lost(lost, &k, "commit of a lease taken over by a transaction");
}

/// Run two transactional claims of `k` at once, each on its own thread: the first holds
/// its transaction open until the second has waited [`TX_HOLD`] (it must not finish in
/// that time), then ends as `first_end`; the second commits. Returns both results.
fn racing_tx_claims<F: TransactionalFactory>(
    factory: &F,
    store: &F::Store,
    k: &Key,
    first_end: TxEnd,
) -> (Result<TxClaim>, Result<TxClaim>) {
    let handle = tokio::runtime::Handle::current();
    let (holding_tx, holding_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let second_done = AtomicBool::new(false);
    tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            let first = scope.spawn(|| {
                let hold: BoxFuture<'static, ()> = Box::pin(async move {
                    let _ = holding_tx.send(());
                    let _ = release_rx.await;
                });
                handle.block_on(
                    factory.claim_in_transaction(store, k, None, "first", hold, first_end),
                )
            });
            holding_rx.recv_timeout(Duration::from_secs(30)).expect(
                "the first transaction never reached its hold (its claim failed or is stuck)",
            );
            let second = scope.spawn(|| {
                let result =
                    handle.block_on(tx_claim(factory, store, k, None, "second", TxEnd::Commit));
                second_done.store(true, Ordering::SeqCst);
                result
            });
            std::thread::sleep(TX_HOLD);
            let waited = !second_done.load(Ordering::SeqCst);
            let _ = release_tx.send(());
            let first = first.join().expect("first transaction thread panicked");
            let second = second.join().expect("second transaction thread panicked");
            assert!(
                waited,
                "the second transaction must wait for the first, which holds the key \
                 (it finished while the first was still open: {second:?})"
            );
            (first, second)
        })
    })
}

/// Two transactions claim one key at once while the first holds its transaction open for
/// [`TX_HOLD`]: the second waits, and when the first commits it gets `Completed`. Exactly
/// one `Claimed` and exactly one business row.
pub async fn concurrent_tx_claims_of_one_key_write_one_business_row<F: TransactionalFactory>(
    factory: &F,
) {
    let (ctx, store) = setup(
        factory,
        "concurrent_tx_claims_of_one_key_write_one_business_row",
    )
    .await;
    let k = key("m1");
    let (first, second) = racing_tx_claims(factory, &store, &k, TxEnd::Commit);
    assert_eq!(first.expect("first"), TxClaim::Claimed { fence: 1 });
    assert_eq!(
        second.expect("second must not fail (no unique violation)"),
        TxClaim::Completed {
            processed_at: ctx.now(),
            outcome: None
        },
        "the second transaction sees the first one's commit"
    );
    assert_rows(factory, &store, &k, &["first"], "after two transactions").await;
}

/// Two transactions claim one key at once; the first rolls back after [`TX_HOLD`]: the
/// second, which waited, then claims (fence 1) and its business row is the only one.
pub async fn a_tx_claim_waiting_on_a_rolled_back_one_claims<F: TransactionalFactory>(factory: &F) {
    let (ctx, store) = setup(factory, "a_tx_claim_waiting_on_a_rolled_back_one_claims").await;
    let k = key("m1");
    let (first, second) = racing_tx_claims(factory, &store, &k, TxEnd::Rollback);
    assert_eq!(first.expect("first"), TxClaim::Claimed { fence: 1 });
    assert_eq!(second.expect("second"), TxClaim::Claimed { fence: 1 });
    assert_rows(
        factory,
        &store,
        &k,
        &["second"],
        "after rollback then commit",
    )
    .await;
    assert_eq!(
        record(&store, &k).await,
        Some(tx_completed(&store, &k, 1, ctx.now()))
    );
}

/// `commit_in_transaction` of a lease writes the business row and completes the key (this
/// token, the outcome, processed now) in one transaction.
pub async fn commit_in_transaction_writes_the_business_row_and_the_completion_together<
    F: TransactionalFactory,
>(
    factory: &F,
) {
    let (ctx, store) = setup(
        factory,
        "commit_in_transaction_writes_the_business_row_and_the_completion_together",
    )
    .await;
    let k = key("m1");
    let lease = acquire(&store, &k).await;
    ctx.clock.advance(Duration::from_secs(2));
    factory
        .commit_in_transaction(&store, &lease, Some(b"o"), "row", TxEnd::Commit)
        .await
        .expect("commit in transaction");
    assert_rows(factory, &store, &k, &["row"], "after commit_in_transaction").await;
    assert_completed_by(&store, &lease, ctx.now(), Some(b"o")).await;
}

/// `commit_in_transaction` with a lease taken over is `LeaseLost`: no business row, and
/// the new owner's lease is untouched.
pub async fn commit_in_transaction_after_takeover_is_rejected_and_writes_nothing<
    F: TransactionalFactory,
>(
    factory: &F,
) {
    let (ctx, store) = setup(
        factory,
        "commit_in_transaction_after_takeover_is_rejected_and_writes_nothing",
    )
    .await;
    let k = key("m1");
    let (stale, current) = taken_over(&store, &ctx, &k).await;
    let lost = factory
        .commit_in_transaction(&store, &stale, Some(b"stale"), "row", TxEnd::Commit)
        .await;
    assert_lease_lost(lost, &k, "commit_in_transaction of a lease taken over");
    assert_rows(factory, &store, &k, &[], "after a rejected commit").await;
    assert_holds(&store, &current, "after a rejected commit_in_transaction").await;
}

/// A `commit_in_transaction` that is rolled back leaves no business row and the lease in
/// flight as it was; the lease can still commit.
pub async fn rolled_back_commit_in_transaction_leaves_the_lease_in_flight<
    F: TransactionalFactory,
>(
    factory: &F,
) {
    let (_ctx, store) = setup(
        factory,
        "rolled_back_commit_in_transaction_leaves_the_lease_in_flight",
    )
    .await;
    let k = key("m1");
    let lease = acquire(&store, &k).await;
    factory
        .commit_in_transaction(&store, &lease, Some(b"o"), "row", TxEnd::Rollback)
        .await
        .expect("the commit inside the transaction succeeds before the rollback");
    assert_rows(factory, &store, &k, &[], "after rollback").await;
    assert_holds(&store, &lease, "after a rolled-back commit").await;
    commit_ok(&store, &lease, None).await;
}

/// A transactional claim whose fingerprint differs from the stored one (a completed key,
/// or a lease in flight) is `FingerprintMismatch` and writes nothing.
pub async fn tx_fingerprint_mismatch_is_an_error_and_writes_nothing<F: TransactionalFactory>(
    factory: &F,
) {
    let (_ctx, store) = setup(
        factory,
        "tx_fingerprint_mismatch_is_an_error_and_writes_nothing",
    )
    .await;
    let done = key("done");
    tx_claim(factory, &store, &done, Some("v1"), "first", TxEnd::Commit)
        .await
        .expect("first tx claim");
    let flying = key("flying");
    let lease = expect_acquired(claim(&store, &flying, &opts_fp("v1")).await, "lease claim");
    for k in [&done, &flying] {
        let result = unchanged(
            &store,
            k,
            "a mismatched tx claim",
            tx_claim(factory, &store, k, Some("v2"), "second", TxEnd::Commit),
        )
        .await;
        assert_fingerprint_mismatch(result, k, "tx claim with another fingerprint");
    }
    assert_rows(factory, &store, &done, &["first"], "after a mismatch").await;
    assert_rows(factory, &store, &flying, &[], "after a mismatch").await;
    assert_holds(&store, &lease, "after a mismatched tx claim").await;
}
