//! Failures kept on the record ([`DedupStore::release_failed`]) and the states of a
//! completed record an operator sees ([`Status`]: processed, failed, dead-lettered).

use std::time::Duration;

use dedup_core::admin::{Admin, ListFilter, Status};
use dedup_core::{DedupStore, Failure, Lease, MAX_FAILURE_LEN, Record, Timestamp, Verdict};

use crate::StoreFactory;
use crate::support::{
    acquire, assert_invalid_input, assert_lease_lost, claim, commit_ok, complete, expect_acquired,
    in_flight, key, key_for, opts, record, release_ok, setup, taken_over, unchanged,
};

/// A failure of `attempt` whose chain holds `text`.
fn failure(text: &str, attempt: u32) -> Failure {
    Failure::new(
        "handler",
        vec![
            format!("handler failed: {text}"),
            "root cause: ünïcödé ✓".into(),
        ],
        attempt,
        Timestamp::from_millis(1_700_000_000_123),
        Some("worker-1"),
    )
}

/// A `release_failed` that must succeed.
async fn release_failed_ok<S: DedupStore + ?Sized>(store: &S, lease: &Lease, f: &Failure) {
    store
        .release_failed(lease, f)
        .await
        .unwrap_or_else(|e| panic!("release_failed of {} must succeed, got {e:?}", lease.key));
}

/// The failure kept on `key`'s record.
async fn kept<S: DedupStore + ?Sized>(store: &S, key: &dedup_core::Key) -> Option<Failure> {
    record(store, key)
        .await
        .unwrap_or_else(|| panic!("{key} must have a record"))
        .last_failure
}

/// A failure released with the lease is read back whole with `get` (kind, every link of
/// the chain byte for byte, when, attempt, worker); the record is released as by
/// `release` (expires now, token, fence and attempt kept) and the next claim acquires at
/// once. The cause stays through that takeover, a renewal, a plain release and the commit;
/// the next `release_failed` replaces it. A failure at the size limit round-trips. A store
/// without [`Capabilities::failure_causes`](dedup_core::Capabilities) answers `Unsupported`
/// and writes nothing.
pub async fn a_released_failure_is_kept_on_the_record_until_replaced<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(
        factory,
        "a_released_failure_is_kept_on_the_record_until_replaced",
    )
    .await;
    let k = key("poison-1");
    let first = acquire(&store, &k).await;
    assert_eq!(
        kept(&store, &k).await,
        None,
        "a new record keeps no failure"
    );
    let f1 = failure("invalid JSON at line 1", 1);
    if !store.capabilities().failure_causes {
        let answer = unchanged(
            &store,
            &k,
            "release_failed on a store without failure_causes",
            store.release_failed(&first, &f1),
        )
        .await;
        assert!(
            matches!(answer, Err(dedup_core::Error::Unsupported(_))),
            "a store without the failure_causes capability answers Unsupported, got {answer:?}"
        );
        return;
    }
    release_failed_ok(&store, &first, &f1).await;
    assert_eq!(
        in_flight(&store, &k).await,
        (first.token, ctx.now(), 1, 1),
        "release_failed releases as release does"
    );
    assert_eq!(
        kept(&store, &k).await,
        Some(f1.clone()),
        "the cause is kept"
    );
    let second = expect_acquired(claim(&store, &k, &opts()).await, "the claim after it");
    assert_eq!((second.fence, second.attempt), (2, 2));
    assert_eq!(
        kept(&store, &k).await,
        Some(f1.clone()),
        "a takeover keeps the cause"
    );
    let renewed = store
        .renew(&second, Duration::from_secs(5))
        .await
        .expect("renew");
    assert_eq!(kept(&store, &k).await, Some(f1), "a renewal keeps it");
    let mut big = failure("", 2);
    while big.encoded_len() < MAX_FAILURE_LEN {
        big.chain[0].push('x');
    }
    if big.encoded_len() > MAX_FAILURE_LEN {
        big.chain[0].pop();
    }
    assert!(big.encoded_len() >= MAX_FAILURE_LEN - 1 && big.validate().is_ok());
    release_failed_ok(&store, &renewed, &big).await;
    assert_eq!(
        kept(&store, &k).await,
        Some(big.clone()),
        "the next release_failed replaces it; a cause at the size limit round-trips"
    );
    let third = expect_acquired(claim(&store, &k, &opts()).await, "the third claim");
    release_ok(&store, &third).await;
    assert_eq!(
        kept(&store, &k).await,
        Some(big.clone()),
        "a plain release keeps it"
    );
    let fourth = expect_acquired(claim(&store, &k, &opts()).await, "the fourth claim");
    commit_ok(&store, &fourth, Some(b"ok")).await;
    assert_eq!(kept(&store, &k).await, Some(big), "the commit keeps it");
}

/// A failure whose encoding is over [`MAX_FAILURE_LEN`] is `InvalidInput` and writes
/// nothing (the lease stays live and held, no cause is kept); `release_failed` with a lease
/// taken over is `LeaseLost` and writes nothing.
pub async fn an_oversized_or_stale_release_failed_writes_nothing<F: StoreFactory>(factory: &F) {
    let (ctx, store) = setup(
        factory,
        "an_oversized_or_stale_release_failed_writes_nothing",
    )
    .await;
    let k = key("m1");
    let lease = acquire(&store, &k).await;
    let oversized = failure(&"x".repeat(MAX_FAILURE_LEN), 1);
    let result = unchanged(
        &store,
        &k,
        "an oversized release_failed",
        store.release_failed(&lease, &oversized),
    )
    .await;
    assert_invalid_input(result, "a failure over MAX_FAILURE_LEN");
    let (stale, _current) = {
        let k2 = key("m2");
        let pair = taken_over(&store, &ctx, &k2).await;
        (pair.0, k2)
    };
    let result = unchanged(
        &store,
        &stale.key,
        "a stale release_failed",
        store.release_failed(&stale, &failure("late", 1)),
    )
    .await;
    if !store.capabilities().failure_causes {
        assert!(
            matches!(result, Err(dedup_core::Error::Unsupported(_))),
            "{result:?}"
        );
        return;
    }
    assert_lease_lost(result, &stale.key, "release_failed after a takeover");
    assert_eq!(kept(&store, &stale.key).await, None);
}

/// Completed records are in one of three states, told apart by their outcome: processed
/// (any handler outcome, none included), failed ([`Verdict::failed`]) and dead-lettered
/// ([`Verdict::dead_letter`], old forms included). `list` filters by each, `stats` counts
/// each apart (a dead letter is never counted as processed), and `consumers` lists every
/// consumer with the same counts.
pub async fn completed_records_are_processed_failed_or_dead_lettered<F: StoreFactory>(factory: &F)
where
    F::Store: Admin,
{
    let (ctx, store) = setup(
        factory,
        "completed_records_are_processed_failed_or_dead_lettered",
    )
    .await;
    let cause = failure("card declined", 5);
    let outcomes: [(&str, Option<Vec<u8>>, Status); 7] = [
        ("a-none", None, Status::Completed),
        ("b-out", Some(b"invoice-7".to_vec()), Status::Completed),
        ("c-nul", Some(b"\0dedup".to_vec()), Status::Completed),
        ("d-failed", Some(Verdict::failed(&cause)), Status::Failed),
        (
            "e-failed-old",
            Some(b"\0dedup:failed\0declined".to_vec()),
            Status::Failed,
        ),
        (
            "f-dead",
            Some(Verdict::dead_letter(5, Some(&cause))),
            Status::DeadLettered,
        ),
        (
            "g-dead-old",
            Some(b"\0dedup:dead-letter\x005".to_vec()),
            Status::DeadLettered,
        ),
    ];
    for (id, outcome, _) in &outcomes {
        complete(&store, &key(id), outcome.as_deref()).await;
    }
    let live = acquire(&store, &key("h-live")).await;
    let released = acquire(&store, &key("i-released")).await;
    if store.capabilities().failure_causes {
        store
            .release_failed(&released, &failure("timeout", 1))
            .await
            .expect("release_failed");
    } else {
        release_ok(&store, &released).await;
    }
    complete(&store, &key_for("shipping", "s1"), None).await;
    let now = ctx.now();
    let dead = record(&store, &key("f-dead")).await.expect("dead letter");
    assert_eq!(Status::of(&dead, now), Status::DeadLettered);
    assert_eq!(
        dead.failure(),
        Some(cause),
        "the dead letter's cause reads back"
    );
    for status in Status::ALL {
        let mut expected: Vec<String> = outcomes
            .iter()
            .filter(|(_, _, s)| *s == status)
            .map(|(id, _, _)| (*id).to_owned())
            .collect();
        match status {
            Status::InFlight => expected.push(live.key.message_id().to_owned()),
            Status::Expired => expected.push(released.key.message_id().to_owned()),
            _ => {}
        }
        let listed: Vec<Record> = store
            .list(&ListFilter::consumer("billing").status(status))
            .await
            .unwrap_or_else(|e| panic!("list {status:?}: {e:?}"));
        let ids: Vec<&str> = listed.iter().map(|r| r.key.message_id()).collect();
        assert_eq!(ids, expected, "list --state {}", status.as_str());
        for r in &listed {
            assert_eq!(Status::of(r, now), status, "{} listed as {status:?}", r.key);
        }
    }
    let stats = store.stats(10).await.expect("stats");
    assert_eq!(
        (
            stats.in_flight,
            stats.expired,
            stats.completed,
            stats.failed,
            stats.dead_lettered
        ),
        (1, 1, 4, 2, 2),
        "stats by state (shipping's record is the fourth processed one)"
    );
    let consumers = store.consumers().await.expect("consumers");
    let summary: Vec<(&str, [u64; 5])> = consumers
        .iter()
        .map(|c| (c.consumer.as_str(), Status::ALL.map(|s| c.counts.count(s))))
        .collect();
    assert_eq!(
        summary,
        vec![("billing", [1, 1, 3, 2, 2]), ("shipping", [0, 0, 1, 0, 0])],
        "consumers in name order, counted by state"
    );
}
