//! A purge run ends under a steady stream of claims: it walks to the stream's last
//! sequence as it was when the run began, not behind the records written since.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use dedup_core::{ClaimOptions, Clock, DedupStore, Key, ManualClock, PurgeOptions, SystemClock};

/// Records the purge must remove.
const OLD: usize = 20;
/// Tasks claiming fresh keys while the purge runs.
const CLAIMERS: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purge_run_ends_under_a_steady_stream_of_claims() {
    let Some(servers) = common::cluster() else {
        return;
    };
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let prefix = common::unique_prefix("purge_stream");
    let store = common::store(&servers, &prefix, Some(clock.clone() as Arc<dyn Clock>)).await;
    for i in 0..OLD {
        let key = Key::new("billing", format!("old-{i}")).expect("key");
        let lease = store
            .claim(&key, &ClaimOptions::default())
            .await
            .expect("claim")
            .into_lease()
            .expect("acquired");
        store.commit(&lease, None).await.expect("commit");
    }
    clock.advance(Duration::from_secs(2 * 3600));

    // The claimers' records expire on the server two minutes after they are written, so
    // the shared test bucket does not keep them.
    let short = dedup_nats_kv::NatsKvStore::connect(
        &servers,
        dedup_nats_kv::NatsKvConfig {
            retention: Duration::from_secs(120),
            ..common::config(&prefix, Some(clock.clone() as Arc<dyn Clock>))
        },
    )
    .await
    .expect("a store of short retention");
    let stop = Arc::new(AtomicBool::new(false));
    let claimed = Arc::new(AtomicUsize::new(0));
    let mut claimers = Vec::new();
    for t in 0..CLAIMERS {
        let (store, stop, claimed) = (short.clone(), stop.clone(), claimed.clone());
        claimers.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let key = Key::new("billing", format!("new-{t}-{n}")).expect("key");
                store
                    .claim(&key, &ClaimOptions::default())
                    .await
                    .expect("claim");
                claimed.fetch_add(1, Ordering::SeqCst);
                n += 1;
            }
        }));
    }
    // The stream is busy before the run starts.
    while claimed.load(Ordering::SeqCst) < 50 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let options = PurgeOptions::older_than(Duration::from_secs(3600)).batch_size(5);
    let report = tokio::time::timeout(Duration::from_secs(60), store.purge(&options))
        .await
        .expect("the purge run ends while claims go on")
        .expect("purge");
    let during = claimed.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    for claimer in claimers {
        claimer.await.expect("a claimer");
    }
    eprintln!(
        "purge under claims: removed {} in {:?}, {during} claims by its end",
        report.total(),
        report.elapsed
    );
    assert_eq!(
        (report.completed, report.expired),
        (OLD as u64, 0),
        "{report:?}"
    );
}
