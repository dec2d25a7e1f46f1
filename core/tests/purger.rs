//! The Purger's settings checks, stop handle and counting on MemoryStore. (Its behaviour on
//! every backend, two purgers at once included, is the conformance clause
//! `purgers_remove_old_records_once_and_keep_live_leases`.)

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::layers::{ObserveOptions, Observed};
use dedup_core::outbox::MemoryOutbox;
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Failure,
    ItemResult, Key, Lease, ManualClock, MemoryStore, PurgeOptions, PurgeReport, Purger,
    PurgerError, PurgerWarning, Record, Result, Retention,
};

mod support;

const MINUTE: Duration = Duration::from_secs(60);

#[test]
fn a_retention_shorter_than_the_longest_lease_is_refused() {
    let err = Purger::new(MINUTE, MINUTE)
        .longest_lease(2 * MINUTE)
        .check()
        .unwrap_err();
    assert!(
        matches!(err, PurgerError::RetentionShorterThanLease { retention, longest_lease }
            if retention == MINUTE && longest_lease == 2 * MINUTE),
        "{err:?}"
    );
    assert!(
        Purger::new(MINUTE, MINUTE)
            .longest_lease(MINUTE)
            .check()
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_zero_period_and_bad_purge_options_are_refused() {
    assert!(matches!(
        Purger::new(MINUTE, Duration::ZERO).check(),
        Err(PurgerError::Invalid(_))
    ));
    let bad = PurgeOptions::older_than(MINUTE).batch_size(0);
    assert!(matches!(
        Purger::new(MINUTE, MINUTE).options(bad).check(),
        Err(PurgerError::Invalid(e)) if e.is_invalid_input()
    ));
}

#[tokio::test]
async fn a_retention_shorter_than_the_redelivery_window_starts_with_a_warning() {
    let store = Arc::new(MemoryStore::new());
    let purger = Purger::new(MINUTE, MINUTE)
        .redelivery_window(10 * MINUTE)
        .start(store)
        .unwrap();
    assert_eq!(
        purger.warnings(),
        [PurgerWarning::RetentionShorterThanRedelivery {
            retention: MINUTE,
            redelivery_window: 10 * MINUTE
        }]
    );
    purger.stop().await;
}

#[tokio::test]
async fn it_purges_periodically_counts_what_it_removed_and_stops_cleanly() {
    let clock = Arc::new(ManualClock::starting_now());
    let store = Arc::new(Observed::new(
        MemoryStore::with_clock(clock.clone()),
        ObserveOptions::new("memory"),
    ));
    let opts = ClaimOptions::default();
    for i in 0..5 {
        let k = Key::new("billing", format!("m{i}")).unwrap();
        let lease = store.claim(&k, &opts).await.unwrap().into_lease().unwrap();
        store.commit(&lease, None).await.unwrap();
    }
    clock.advance(2 * MINUTE);
    let purger = Purger::spawn(store.clone(), MINUTE, Duration::from_millis(5)).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while purger.removed() < 5 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Two more records age past retention while it runs.
    for i in 5..7 {
        let k = Key::new("billing", format!("m{i}")).unwrap();
        let lease = store.claim(&k, &opts).await.unwrap().into_lease().unwrap();
        store.commit(&lease, None).await.unwrap();
    }
    clock.advance(2 * MINUTE);
    while purger.removed() < 7 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = purger.stop().await;
    assert_eq!(stats.removed, 7, "{stats:?}");
    assert!(stats.runs >= 2, "{stats:?}");
    assert_eq!(stats.failures, 0);
    // The layer counted the same records.
    assert_eq!(store.counts().purged, 7);
    // Stopped: a record that ages past retention now stays.
    let k = Key::new("billing", "after-stop").unwrap();
    let lease = store.claim(&k, &opts).await.unwrap().into_lease().unwrap();
    store.commit(&lease, None).await.unwrap();
    clock.advance(2 * MINUTE);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(store.get(&k).await.unwrap().is_some());
}

#[test]
fn the_default_retention_keeps_a_week_and_purges_every_ten_minutes() {
    let retention = Retention::default();
    assert_eq!(retention.keep, Duration::from_secs(7 * 24 * 3600));
    assert_eq!(retention.every, Duration::from_secs(600));
    let purger = retention.purger();
    assert_eq!(purger, Purger::new(retention.keep, retention.every));
}

#[tokio::test(start_paused = true)]
async fn a_failed_run_is_counted_and_the_next_period_tries_again() {
    let store = Arc::new(support::flaky(2, true));
    let purger = Purger::spawn(store, MINUTE, Duration::from_millis(5)).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stats = purger.stop().await;
    assert_eq!(stats.failures, 2, "{stats:?}");
    assert!(stats.runs >= 10, "{stats:?}");
}

/// A MemoryStore whose purge panics.
#[derive(Debug, Default)]
struct PanickingPurge(MemoryStore);

#[async_trait]
impl DedupStore for PanickingPurge {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        self.0.claim(key, options).await
    }
    async fn claim_many(&self, r: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        self.0.claim_many(r).await
    }
    async fn renew(&self, lease: &Lease, d: Duration) -> Result<Lease> {
        self.0.renew(lease, d).await
    }
    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        self.0.commit(lease, outcome).await
    }
    async fn commit_many(&self, r: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        self.0.commit_many(r).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.0.release(lease).await
    }
    async fn release_failed(&self, lease: &Lease, failure: &Failure) -> Result<()> {
        self.0.release_failed(lease, failure).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        self.0.get(key).await
    }
    async fn purge(&self, _: &PurgeOptions) -> Result<PurgeReport> {
        panic!("the purge broke");
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_the_purge_task_comes_out_of_stop() {
    let store = Arc::new(PanickingPurge::default());
    let purger = Purger::spawn(store, MINUTE, Duration::from_millis(5)).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stopped = tokio::spawn(purger.stop()).await;
    let panic = stopped.expect_err("stop panics").into_panic();
    assert_eq!(panic.downcast_ref::<&str>(), Some(&"the purge broke"));
}

#[test]
fn a_retention_as_long_as_the_redelivery_window_starts_without_a_warning() {
    let warnings = Purger::new(MINUTE, MINUTE)
        .redelivery_window(MINUTE)
        .check()
        .unwrap();
    assert_eq!(warnings, []);
}

/// A store on a manual clock holding `n` records completed two minutes ago.
async fn aged(n: usize) -> Arc<MemoryStore> {
    let clock = Arc::new(ManualClock::starting_now());
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    for i in 0..n {
        let k = Key::new("billing", format!("m{i}")).unwrap();
        let claim = store.claim(&k, &ClaimOptions::default()).await.unwrap();
        store
            .commit(&claim.into_lease().unwrap(), None)
            .await
            .unwrap();
    }
    clock.advance(2 * MINUTE);
    store
}

#[tokio::test(start_paused = true)]
async fn the_handle_counts_the_records_removed_while_it_runs() {
    let purger = Purger::spawn(aged(3).await, MINUTE, Duration::from_millis(5)).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(purger.removed(), 3);
    assert_eq!(purger.stop().await.removed, 3);
}

#[test]
fn stopped_after_its_runtime_shut_down_it_still_reports_what_it_removed() {
    let paused = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
    };
    let first = paused();
    let purger = first.block_on(async {
        let purger = Purger::spawn(aged(3).await, MINUTE, Duration::from_millis(5)).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        purger
    });
    drop(first);
    let stats = paused().block_on(purger.stop());
    assert_eq!(stats.removed, 3, "{stats:?}");
    assert_eq!(
        stats.runs, 0,
        "the task's own count went with it: {stats:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_run_that_removed_records_logs_at_info_and_an_empty_one_at_debug() {
    let log = support::warnings::Warnings::default();
    let _guard = tracing::subscriber::set_default(log.clone());
    let purger = Purger::spawn(aged(2).await, MINUTE, Duration::from_millis(5)).unwrap();
    let outbox = Purger::new(MINUTE, Duration::from_millis(5))
        .start_outbox(Arc::new(MemoryOutbox::new()))
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    purger.stop().await;
    outbox.stop().await;

    let info = log.at(tracing::Level::INFO);
    assert_eq!(
        info.len(),
        1,
        "only the first run removed anything: {info:?}"
    );
    assert_eq!(
        (info[0]["removed"].as_str(), info[0]["what"].as_str()),
        ("2", "inbox")
    );
    let empty: Vec<String> = log
        .at(tracing::Level::DEBUG)
        .into_iter()
        .filter(|e| e["message"] == "dedup purger: nothing to remove")
        .map(|e| e["what"].clone())
        .collect();
    assert!(empty.iter().any(|w| w == "inbox"), "{empty:?}");
    assert!(empty.iter().any(|w| w == "outbox"), "{empty:?}");
    assert!(
        empty.iter().all(|w| w == "inbox" || w == "outbox"),
        "{empty:?}"
    );
}
