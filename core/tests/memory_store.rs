//! Every state transition of the contract table, on MemoryStore with a manual clock.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::{
    Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Error, Fingerprint, Key,
    ManualClock, MemoryStore, PurgeOptions, RecordState, Timestamp,
};

const LEASE: Duration = Duration::from_secs(10);

fn setup() -> (MemoryStore, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
    (MemoryStore::with_clock(clock.clone()), clock)
}

fn key(id: &str) -> Key {
    Key::new("billing", id).unwrap()
}

fn opts() -> ClaimOptions {
    ClaimOptions::lease(LEASE)
}

async fn acquire(store: &MemoryStore, k: &Key) -> dedup_core::Lease {
    match store.claim(k, &opts()).await.unwrap() {
        Claim::Acquired(l) => l,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

#[tokio::test]
async fn absent_claim_acquires_fence_1_attempt_1() {
    let (s, clock) = setup();
    let l = acquire(&s, &key("a")).await;
    assert_eq!((l.fence, l.attempt), (1, 1));
    assert_eq!(l.expires_at, clock.now_plus(LEASE));
    let rec = s.get(&key("a")).await.unwrap().unwrap();
    assert!(matches!(rec.state, RecordState::InFlight { token, .. } if token == l.token));
}

trait NowPlus {
    fn now_plus(&self, d: Duration) -> Timestamp;
}
impl NowPlus for ManualClock {
    fn now_plus(&self, d: Duration) -> Timestamp {
        dedup_core::Clock::now(self).saturating_add(d)
    }
}

#[tokio::test]
async fn live_lease_gives_in_flight_and_changes_nothing() {
    let (s, clock) = setup();
    let l = acquire(&s, &key("a")).await;
    let before = s.get(&key("a")).await.unwrap();
    clock.advance(LEASE - Duration::from_millis(1));
    let c = s.claim(&key("a"), &opts()).await.unwrap();
    assert_eq!(
        c,
        Claim::InFlight {
            expires_at: l.expires_at,
            attempt: 1
        }
    );
    assert_eq!(s.get(&key("a")).await.unwrap(), before);
}

#[tokio::test]
async fn expired_lease_is_taken_over_with_fence_and_attempt_plus_one() {
    let (s, clock) = setup();
    let first = acquire(&s, &key("a")).await;
    clock.advance(LEASE);
    let second = acquire(&s, &key("a")).await;
    assert_eq!((second.fence, second.attempt), (2, 2));
    assert_ne!(second.token, first.token);
    // The stale owner can do nothing any more.
    assert!(matches!(
        s.commit(&first, None).await,
        Err(Error::LeaseLost { .. })
    ));
    assert!(matches!(
        s.release(&first).await,
        Err(Error::LeaseLost { .. })
    ));
    assert!(matches!(
        s.renew(&first, LEASE).await,
        Err(Error::LeaseLost { .. })
    ));
    let rec = s.get(&key("a")).await.unwrap().unwrap();
    assert!(matches!(rec.state, RecordState::InFlight { token, .. } if token == second.token));
}

#[tokio::test]
async fn completed_gives_completed_with_outcome_and_commit_is_retry_safe() {
    let (s, clock) = setup();
    let l = acquire(&s, &key("a")).await;
    clock.advance(Duration::from_secs(1));
    let at = dedup_core::Clock::now(&*clock);
    s.commit(&l, Some(b"\x00\xffok")).await.unwrap();
    s.commit(&l, Some(b"other")).await.unwrap();
    clock.advance(Duration::from_secs(100));
    assert_eq!(
        s.claim(&key("a"), &opts()).await.unwrap(),
        Claim::Completed {
            processed_at: at,
            outcome: Some(b"\x00\xffok".to_vec())
        }
    );
    // Renew and release after commit are "anything else".
    assert!(s.renew(&l, LEASE).await.unwrap_err().is_lease_lost());
    assert!(s.release(&l).await.unwrap_err().is_lease_lost());
}

#[tokio::test]
async fn commit_of_an_expired_but_untaken_lease_succeeds() {
    let (s, clock) = setup();
    let l = acquire(&s, &key("a")).await;
    clock.advance(LEASE * 5);
    s.commit(&l, None).await.unwrap();
    assert!(matches!(
        s.claim(&key("a"), &opts()).await.unwrap(),
        Claim::Completed { outcome: None, .. }
    ));
}

#[tokio::test]
async fn release_lets_the_next_claim_acquire_at_once_and_fences_grow() {
    let (s, _clock) = setup();
    let l1 = acquire(&s, &key("a")).await;
    s.release(&l1).await.unwrap();
    s.release(&l1).await.unwrap(); // again: Ok
    let l2 = acquire(&s, &key("a")).await;
    assert_eq!((l2.fence, l2.attempt), (2, 2));
    assert!(s.release(&l1).await.unwrap_err().is_lease_lost());
}

#[tokio::test]
async fn renew_extends_from_now() {
    let (s, clock) = setup();
    let l = acquire(&s, &key("a")).await;
    clock.advance(Duration::from_secs(8));
    let r = s.renew(&l, LEASE).await.unwrap();
    assert_eq!(r.expires_at, clock.now_plus(LEASE));
    assert_eq!((r.fence, r.token), (l.fence, l.token));
    clock.advance(Duration::from_secs(8)); // 16 s after the claim: alive thanks to renew
    assert!(matches!(
        s.claim(&key("a"), &opts()).await.unwrap(),
        Claim::InFlight { .. }
    ));
}

#[tokio::test]
async fn fingerprint_mismatch_in_every_state_changes_nothing() {
    let (s, clock) = setup();
    let f = |p: &[u8]| opts().with_fingerprint(Fingerprint::of_payload(p));
    let k = key("a");
    let l = match s.claim(&k, &f(b"one")).await.unwrap() {
        Claim::Acquired(l) => l,
        c => panic!("{c:?}"),
    };
    let check = |s: MemoryStore| async move {
        let before = s.get(&key("a")).await.unwrap();
        assert!(matches!(
            s.claim(&key("a"), &f(b"two")).await,
            Err(Error::FingerprintMismatch { .. })
        ));
        assert_eq!(s.get(&key("a")).await.unwrap(), before);
    };
    check(s.clone()).await; // in flight, live
    clock.advance(LEASE);
    check(s.clone()).await; // in flight, expired
    // Same fingerprint or none: fine.
    let l2 = s.claim(&k, &f(b"one")).await.unwrap().into_lease().unwrap();
    assert_eq!(l2.fence, 2);
    assert!(s.commit(&l, None).await.unwrap_err().is_lease_lost());
    s.commit(&l2, None).await.unwrap();
    check(s.clone()).await; // completed
    assert!(matches!(
        s.claim(&k, &opts()).await.unwrap(),
        Claim::Completed { .. }
    ));
}

#[tokio::test]
async fn consumers_are_isolated() {
    let (s, _) = setup();
    let billing = Key::new("billing", "m1").unwrap();
    let notify = Key::new("notification", "m1").unwrap();
    let l = acquire(&s, &billing).await;
    s.commit(&l, None).await.unwrap();
    assert!(s.claim(&notify, &opts()).await.unwrap().is_acquired());
}

#[tokio::test]
async fn purge_removes_only_what_is_past_retention() {
    let (s, clock) = setup();
    let day = Duration::from_secs(86_400);
    let old = acquire(&s, &key("old")).await;
    s.commit(&old, None).await.unwrap();
    let _abandoned = acquire(&s, &key("abandoned")).await; // expires after LEASE
    clock.advance(day * 9);
    let recent = acquire(&s, &key("recent")).await;
    s.commit(&recent, None).await.unwrap();
    clock.advance(day);
    let live = s
        .claim(&key("live"), &ClaimOptions::lease(day * 30))
        .await
        .unwrap();
    assert!(live.is_acquired());
    let report = s
        .purge(&PurgeOptions::older_than(day * 7).batch_size(1))
        .await
        .unwrap();
    assert_eq!((report.completed, report.expired), (1, 1));
    assert_eq!(report.batches, 3, "two batches of one, then an empty one");
    assert!(s.get(&key("old")).await.unwrap().is_none());
    assert!(s.get(&key("abandoned")).await.unwrap().is_none());
    assert!(s.get(&key("recent")).await.unwrap().is_some());
    assert!(s.get(&key("live")).await.unwrap().is_some());
    // Retention zero still never removes a live lease.
    let r = s
        .purge(&PurgeOptions::older_than(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(r.total(), 1); // "recent"
    assert!(s.get(&key("live")).await.unwrap().is_some());
}

#[tokio::test]
async fn batches_equal_their_sequential_meaning() {
    let (s, _) = setup();
    let reqs: Vec<_> = ["a", "b", "a"]
        .iter()
        .map(|id| ClaimRequest::new(key(id), opts()))
        .collect();
    let out = s.claim_many(&reqs).await.unwrap();
    let a = out[0].as_ref().unwrap().lease().unwrap().clone();
    let b = out[1].as_ref().unwrap().lease().unwrap().clone();
    assert!(matches!(out[2], Ok(Claim::InFlight { attempt: 1, .. })));
    let commits = vec![
        CommitRequest {
            lease: a.clone(),
            outcome: Some(b"A".to_vec()),
        },
        CommitRequest {
            lease: a.clone(),
            outcome: None,
        },
        CommitRequest {
            lease: b.clone(),
            outcome: None,
        },
    ];
    let res = s.commit_many(&commits).await.unwrap();
    assert!(res.iter().all(Result::is_ok));
    assert!(matches!(
        s.claim(&key("a"), &opts()).await.unwrap(),
        Claim::Completed { outcome: Some(o), .. } if o == b"A"
    ));
}

#[tokio::test]
async fn invalid_input_writes_nothing() {
    let (s, _) = setup();
    assert!(
        s.claim(&key("a"), &ClaimOptions::lease(Duration::ZERO))
            .await
            .unwrap_err()
            .is_invalid_input()
    );
    let mut reqs = vec![ClaimRequest::new(key("b"), opts())];
    reqs.push(ClaimRequest::new(
        key("c"),
        ClaimOptions::lease(Duration::ZERO),
    ));
    assert!(s.claim_many(&reqs).await.unwrap_err().is_invalid_input());
    assert!(s.is_empty());
    let l = acquire(&s, &key("d")).await;
    let big = vec![0u8; dedup_core::MAX_OUTCOME_LEN + 1];
    assert!(
        s.commit(&l, Some(&big))
            .await
            .unwrap_err()
            .is_invalid_input()
    );
    assert!(matches!(
        s.get(&key("d")).await.unwrap().unwrap().state,
        RecordState::InFlight { .. }
    ));
}
