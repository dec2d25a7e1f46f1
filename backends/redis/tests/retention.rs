//! Retention: records live for the configured retention (completed: after the commit; in
//! flight: after the lease expires), by native expiry (`PEXPIRE`) and, by the store's clock,
//! in every script: past its retention a record is absent for every operation. Also the
//! server's clock as the default "now". Standalone and cluster.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Target, config};
use dedup_core::{
    Claim, ClaimOptions, Clock, DedupStore, Key, ManualClock, PurgeOptions, SystemClock,
};
use dedup_redis::redis::{self, Value};
use dedup_redis::{RedisConfig, RedisStore};

const HOUR: Duration = Duration::from_secs(3600);
const LEASE: Duration = Duration::from_secs(10);
const MS: Duration = Duration::from_millis(1);

async fn pttl(target: &Target, store: &RedisStore, key: &Key) -> i64 {
    match target
        .raw()
        .await
        .run(redis::cmd("PTTL").arg(store.redis_key(key)))
        .await
    {
        Value::Int(ms) => ms,
        other => panic!("PTTL: {other:?}"),
    }
}

async fn exists(target: &Target, store: &RedisStore, key: &Key) -> bool {
    target
        .raw()
        .await
        .run(redis::cmd("EXISTS").arg(store.redis_key(key)))
        .await
        == Value::Int(1)
}

/// `ttl` is within a few seconds below `expected` (PTTL counts down in real time).
fn close_below(ttl: i64, expected: Duration, what: &str) {
    let expected = i64::try_from(expected.as_millis()).unwrap();
    assert!(
        ttl <= expected && ttl > expected - 5_000,
        "{what}: PTTL {ttl} ms, expected just under {expected} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_past_retention_are_absent_by_the_stores_clock() {
    for target in Target::all("records_past_retention_are_absent_by_the_stores_clock") {
        let clock = Arc::new(ManualClock::starting_now());
        let store = target
            .open(RedisConfig {
                retention: HOUR,
                ..config("retention", &clock)
            })
            .await;
        let opts = ClaimOptions::lease(LEASE);

        // Completed: kept for exactly `retention` after the commit.
        let done = Key::new("r", "done").unwrap();
        let lease = store
            .claim(&done, &opts)
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        close_below(
            pttl(&target, &store, &done).await,
            LEASE + HOUR,
            "in flight",
        );
        store.commit(&lease, Some(b"o")).await.unwrap();
        close_below(pttl(&target, &store, &done).await, HOUR, "completed");
        clock.advance(HOUR - MS);
        assert!(matches!(
            store.claim(&done, &opts).await.unwrap(),
            Claim::Completed { .. }
        ));
        assert!(store.get(&done).await.unwrap().is_some());
        clock.advance(MS);
        assert_eq!(store.get(&done).await.unwrap(), None, "{}", target.name());
        // The commit is retry-safe only while the record exists.
        assert!(
            store
                .commit(&lease, None)
                .await
                .unwrap_err()
                .is_lease_lost()
        );
        let again = store
            .claim(&done, &opts)
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        assert_eq!((again.fence, again.attempt), (1, 1), "a fresh start");

        // In flight: kept for `retention` after the lease expires; renew moves that.
        let open = Key::new("r", "open").unwrap();
        let lease = store
            .claim(&open, &opts)
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        let lease = store.renew(&lease, 2 * LEASE).await.unwrap();
        close_below(
            pttl(&target, &store, &open).await,
            2 * LEASE + HOUR,
            "renewed",
        );
        clock.advance(2 * LEASE + HOUR - MS);
        assert!(store.get(&open).await.unwrap().is_some());
        clock.advance(MS);
        assert_eq!(store.get(&open).await.unwrap(), None);
        assert!(store.release(&lease).await.unwrap_err().is_lease_lost());
        assert!(
            store
                .renew(&lease, LEASE)
                .await
                .unwrap_err()
                .is_lease_lost()
        );
        assert!(
            store
                .commit(&lease, None)
                .await
                .unwrap_err()
                .is_lease_lost()
        );
        let again = store
            .claim(&open, &opts)
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        assert_eq!(again.fence, 1);

        // Release shortens the retention to `retention` after the release.
        let released = Key::new("r", "released").unwrap();
        let lease = store
            .claim(&released, &opts)
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        store.release(&lease).await.unwrap();
        close_below(pttl(&target, &store, &released).await, HOUR, "released");

        // Purge with a retention longer than the store's: records already past the store's
        // retention are deleted but not counted (they were absent already).
        let gone = Key::new("r", "gone").unwrap();
        let lease = store
            .claim(&gone, &opts)
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        store.commit(&lease, None).await.unwrap();
        clock.advance(HOUR);
        assert!(
            exists(&target, &store, &gone).await,
            "natively it is still there"
        );
        // Unpaced, so the batch count is exact (a paced batch stops at its deadline, and
        // the shared test server's keyspace is large).
        let report = store
            .purge(&PurgeOptions::older_than(2 * HOUR).unpaced())
            .await
            .unwrap();
        assert_eq!(
            (report.completed, report.expired, report.batches),
            (0, 0, 1),
            "{}: {report:?}",
            target.name()
        );
        assert!(!exists(&target, &store, &gone).await, "purge deleted it");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_clock_is_the_default() {
    for target in Target::all("the_servers_clock_is_the_default") {
        let store = target
            .open(RedisConfig {
                prefix: common::unique_prefix("server_clock"),
                ..RedisConfig::default()
            })
            .await;
        assert!(store.config().clock.is_none());
        let key = Key::new("clock", "m1").unwrap();
        let before = SystemClock.now();
        let lease = store
            .claim(&key, &ClaimOptions::lease(HOUR))
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        let after = SystemClock.now();
        // The test server runs on this machine: its TIME agrees with ours within a second.
        let slack = Duration::from_secs(1);
        assert!(
            lease.expires_at >= before.saturating_add(HOUR).saturating_sub(slack)
                && lease.expires_at <= after.saturating_add(HOUR).saturating_add(slack),
            "expires_at {} not about an hour from now ({before}..{after})",
            lease.expires_at
        );
        assert_eq!(
            store.claim(&key, &ClaimOptions::lease(HOUR)).await.unwrap(),
            Claim::InFlight {
                expires_at: lease.expires_at,
                attempt: 1
            }
        );
        close_below(
            pttl(&target, &store, &key).await,
            HOUR + RedisConfig::default().retention,
            "default retention",
        );
        store.commit(&lease, None).await.unwrap();
        match store.claim(&key, &ClaimOptions::default()).await.unwrap() {
            Claim::Completed { processed_at, .. } => assert!(
                processed_at >= before.saturating_sub(slack)
                    && processed_at <= SystemClock.now().saturating_add(slack)
            ),
            other => panic!("{other:?}"),
        }
    }
}

/// A purge batch reports the server time it held (its `SCAN` steps and purge scripts, timed
/// with `TIME` and, on Valkey, whose `TIME` stands still inside a script, `os.clock`), which pacing counts instead of its round trips' wall time: more
/// than nothing, and never more than the batch's own wall time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_batch_reports_the_server_time_it_held() {
    use dedup_core::backend::{PurgeBatches, PurgeStep};
    use std::time::Instant;
    for target in Target::all("a_purge_batch_reports_the_server_time_it_held") {
        let clock = Arc::new(ManualClock::starting_now());
        let store = target.open(config("purge_server_time", &clock)).await;
        let keys: Vec<Key> = (0..200)
            .map(|i| Key::new("p", format!("m{i}")).unwrap())
            .collect();
        for key in &keys {
            let lease = store
                .claim(key, &ClaimOptions::lease(LEASE))
                .await
                .unwrap()
                .into_lease()
                .unwrap();
            store.commit(&lease, None).await.unwrap();
        }
        clock.advance(2 * HOUR);
        let mut cursor = Default::default();
        let step = PurgeStep {
            retention: HOUR,
            limit: 1000,
            deadline: None,
        };
        let (mut removed, mut work, mut wall) = (0, Duration::ZERO, Duration::ZERO);
        loop {
            let started = Instant::now();
            let batch = store.purge_batch(&step, &mut cursor).await.unwrap();
            let took = started.elapsed();
            let held = batch
                .work
                .expect("Redis reports the server time a batch held");
            assert!(held <= took, "{}: held {held:?} in {took:?}", target.name());
            removed += batch.total();
            work += held;
            wall += took;
            if batch.exhausted {
                break;
            }
        }
        assert_eq!(removed, 200, "{}", target.name());
        assert!(work > Duration::ZERO, "{}: {work:?}", target.name());
        assert!(work < wall, "{}: {work:?} of {wall:?}", target.name());
    }
}
