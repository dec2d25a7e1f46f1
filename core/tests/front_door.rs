//! The front door (`backend/front_door.rs`): what every `Storage` answers as a `DedupStore`
//! and an `Admin`, on MemoryStore with a manual clock. Each test pins a rule a mutant of
//! `front_door.rs` broke while every other test still passed (see `MUTANTS.md`).

use std::sync::Arc;
use std::time::Duration;

use dedup_core::{
    Admin, Claim, ClaimOptions, CommitRequest, CountSource, DedupStore, Error, Failure, Forgot,
    Key, Lease, ListFilter, ManualClock, MemoryStore, PurgeOptions, RecordState, Released, Status,
    Timestamp,
};

const LEASE: Duration = Duration::from_secs(10);
const START: Timestamp = Timestamp::from_millis(1_000_000);

fn setup() -> (MemoryStore, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(START));
    (MemoryStore::with_clock(clock.clone()), clock)
}

fn key(id: &str) -> Key {
    Key::new("billing", id).unwrap()
}

async fn acquire(store: &MemoryStore, k: &Key) -> Lease {
    match store.claim(k, &ClaimOptions::lease(LEASE)).await.unwrap() {
        Claim::Acquired(lease) => lease,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

#[tokio::test]
async fn the_admin_reads_the_store_clock_and_counts_its_records() {
    let (store, clock) = setup();
    let live = acquire(&store, &key("live")).await;
    let done = acquire(&store, &key("done")).await;
    store.commit(&done, Some(b"ok")).await.unwrap();

    assert_eq!(store.now().await.unwrap(), START);
    let listed = store.list(&ListFilter::consumer("billing")).await.unwrap();
    let keys: Vec<&str> = listed.iter().map(|r| r.key.message_id()).collect();
    assert_eq!(keys, ["done", "live"]);

    let stats = store.stats(10).await.unwrap();
    assert_eq!((stats.now, stats.in_flight, stats.completed), (START, 1, 1));
    assert_eq!(stats.oldest_live.map(|s| s.key), Some(live.key));

    let consumers = store.consumers().await.unwrap();
    assert_eq!(consumers.len(), 1);
    assert_eq!(consumers[0].consumer, "billing");
    assert_eq!(consumers[0].counts.completed, 1);

    clock.advance(Duration::from_secs(3600));
    let purgeable = store
        .count_purgeable(Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!((purgeable.completed, purgeable.expired), (1, 1));
}

#[tokio::test]
async fn a_finished_purge_is_kept_as_the_last_purge_run() {
    let (store, clock) = setup();
    assert_eq!(store.last_purge().await.unwrap(), None);
    let done = acquire(&store, &key("done")).await;
    store.commit(&done, None).await.unwrap();
    clock.advance(Duration::from_secs(3600));

    let report = store
        .purge(&PurgeOptions::older_than(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(report.completed, 1);
    let run = store.last_purge().await.unwrap().expect("a run was kept");
    assert_eq!(run.removed, 1);
    assert_eq!(
        run.finished_at,
        START.saturating_add(Duration::from_secs(3600))
    );
}

#[tokio::test]
async fn a_store_without_kept_counts_scans_and_refuses_to_keep_them() {
    let (store, _) = setup();
    assert_eq!(
        store.count_source().await.unwrap(),
        CountSource::Scan { keepable: false }
    );
    for answer in [store.enable_counts().await, store.disable_counts().await] {
        assert!(matches!(answer, Err(Error::Unsupported(_))), "{answer:?}");
    }
}

#[tokio::test]
async fn the_front_door_reports_the_backends_own_capabilities() {
    let (store, _) = setup();
    let capabilities = DedupStore::capabilities(&store);
    assert!(capabilities.native_batch && capabilities.first_claim_time);
    assert!(!capabilities.persistent);
}

#[tokio::test]
async fn release_key_refuses_a_live_lease_without_force_and_revokes_it_with_force() {
    let (store, _) = setup();
    let k = key("m");
    let lease = acquire(&store, &k).await;
    assert_eq!(
        store.release_key(&k, false).await.unwrap(),
        Released::LiveLease {
            expires_at: lease.expires_at,
            attempt: 1
        }
    );
    assert_eq!(
        store.release_key(&k, true).await.unwrap(),
        Released::Released {
            fence: 1,
            attempt: 1,
            was_live: true
        }
    );
    let err = store.commit(&lease, None).await.unwrap_err();
    assert!(err.is_lease_lost(), "{err:?}");
    assert_eq!(acquire(&store, &k).await.fence, 2);
}

#[tokio::test]
async fn release_key_at_the_expiry_instant_releases_a_lease_no_longer_live() {
    let (store, clock) = setup();
    let k = key("m");
    let lease = acquire(&store, &k).await;
    clock.set(lease.expires_at);
    assert_eq!(
        store.release_key(&k, false).await.unwrap(),
        Released::Released {
            fence: 1,
            attempt: 1,
            was_live: false
        }
    );
    let err = store.release(&lease).await.unwrap_err();
    assert!(err.is_lease_lost(), "{err:?}");
}

#[tokio::test]
async fn release_key_of_a_completed_or_absent_key_changes_nothing() {
    let (store, _) = setup();
    let k = key("m");
    let lease = acquire(&store, &k).await;
    store.commit(&lease, None).await.unwrap();
    assert_eq!(
        store.release_key(&k, true).await.unwrap(),
        Released::Completed {
            processed_at: START
        }
    );
    assert_eq!(
        store.release_key(&key("never"), true).await.unwrap(),
        Released::NotFound
    );
    let record = store.get(&k).await.unwrap().unwrap();
    assert!(matches!(record.state, RecordState::Completed { .. }));
}

#[tokio::test]
async fn forget_removes_the_record_so_the_next_claim_starts_at_fence_one() {
    let (store, _) = setup();
    let k = key("m");
    let lease = acquire(&store, &k).await;
    store.commit(&lease, None).await.unwrap();
    assert_eq!(
        store.forget(&k, false).await.unwrap(),
        Forgot::Forgot {
            status: Status::Completed,
            fence: 1,
            attempt: 1
        }
    );
    assert_eq!(store.get(&k).await.unwrap(), None);
    assert_eq!(acquire(&store, &k).await.fence, 1);
}

#[tokio::test]
async fn a_failed_release_stores_its_failure_and_frees_the_key() {
    let (store, _) = setup();
    let k = key("m");
    let lease = acquire(&store, &k).await;
    let failure = Failure::new("handler", vec!["boom".into()], 1, START, None);
    store.release_failed(&lease, &failure).await.unwrap();
    let record = store.get(&k).await.unwrap().unwrap();
    assert_eq!(record.last_failure, Some(failure));
    assert_eq!(acquire(&store, &k).await.attempt, 2);
}

#[tokio::test]
async fn bad_input_is_refused_before_the_store_and_writes_nothing() {
    let (store, _) = setup();
    let k = key("m");
    let lease = acquire(&store, &k).await;
    let refused = |r: dedup_core::Result<()>| matches!(r, Err(Error::InvalidInput { .. }));

    let no_kind = Failure::new("", vec!["boom".into()], 1, START, None);
    assert!(refused(store.release_failed(&lease, &no_kind).await));
    let record = store.get(&k).await.unwrap().unwrap();
    assert_eq!(record.last_failure, None);
    assert!(matches!(
        record.state,
        RecordState::InFlight { expires_at, .. } if expires_at == lease.expires_at
    ));

    let renewed = store.renew(&lease, Duration::ZERO).await.map(drop);
    assert!(refused(renewed));
    let too_big = vec![0; dedup_core::MAX_OUTCOME_LEN + 1];
    let batch = [CommitRequest {
        lease: lease.clone(),
        outcome: Some(too_big),
    }];
    assert!(refused(store.commit_many(&batch).await.map(drop)));
    let record = store.get(&k).await.unwrap().unwrap();
    assert!(matches!(
        record.state,
        RecordState::InFlight { expires_at, .. } if expires_at == lease.expires_at
    ));

    let no_rows = ListFilter::consumer("billing").limit(0);
    assert!(refused(store.list(&no_rows).await.map(drop)));
    let too_many = ListFilter::consumer("billing").limit(dedup_core::admin::MAX_LIST_LIMIT + 1);
    assert!(refused(store.list(&too_many).await.map(drop)));
    assert!(refused(
        store.stats(dedup_core::admin::MAX_TOP + 1).await.map(drop)
    ));
}
