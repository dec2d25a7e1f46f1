//! Retiring partitions: what a purge of a ring removes and keeps, the layout checks, and
//! claims racing the truncate.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::{
    Admin, Claim, ClaimOptions, Clock, CommitRequest, DedupStore, Error, Key, Lease, ManualClock,
    PurgeOptions, Timestamp,
};
use dedup_postgres::{PostgresStore, sqlx};

use super::common;

/// One second windows, 5 partitions: retention up to 3 s.
const WINDOW_MS: i64 = 1000;

fn key(id: &str) -> Key {
    Key::new("retire", id).expect("key")
}

/// A manual clock at the start of a window.
fn aligned_clock() -> Arc<ManualClock> {
    let now = Timestamp::from_system_time(std::time::SystemTime::now()).as_millis();
    Arc::new(ManualClock::new(Timestamp::from_millis(
        now - now.rem_euclid(WINDOW_MS),
    )))
}

async fn ring_store(url: &str, test: &str, clock: &Arc<ManualClock>) -> PostgresStore {
    let mut config = common::config_with(
        &common::unique_table(test),
        common::ring(WINDOW_MS as u64, 5),
    );
    config.clock = Some(clock.clone());
    PostgresStore::connect_with(url, config)
        .await
        .expect("connect and migrate")
}

async fn acquire(store: &PostgresStore, k: &Key, lease: Duration) -> Lease {
    match store
        .claim(k, &ClaimOptions::lease(lease))
        .await
        .expect("claim")
    {
        Claim::Acquired(lease) => lease,
        other => panic!("{k}: {other:?}"),
    }
}

async fn complete(store: &PostgresStore, k: &Key) {
    let lease = acquire(store, k, Duration::from_secs(30)).await;
    store.commit(&lease, None).await.expect("commit");
}

async fn purge(store: &PostgresStore, retention: Duration) -> dedup_core::PurgeReport {
    store
        .purge(&PurgeOptions::older_than(retention).unpaced())
        .await
        .expect("purge")
}

/// Rows of `store`'s table by partition.
async fn rows_per_slot(store: &PostgresStore) -> Vec<(i16, i64)> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT slot, count(*) FROM {} GROUP BY slot ORDER BY slot",
        store.table()
    )))
    .fetch_all(store.pool())
    .await
    .expect("rows per slot")
}

/// A purge retires each partition whose window ended before the cutoff: its completed
/// and expired records are removed and counted, a lease still live is moved to the
/// current partition and can commit; records within retention stay; a second purge
/// removes nothing.
#[tokio::test]
async fn whole_windows_past_retention_are_retired_and_live_leases_kept() {
    let url = crate::url_or_skip!();
    let clock = aligned_clock();
    let store = ring_store(&url, "retire_windows", &clock).await;
    // Window 0.
    complete(&store, &key("old-done")).await;
    acquire(&store, &key("old-expired"), Duration::from_millis(100)).await;
    let live = acquire(&store, &key("old-live"), Duration::from_secs(3600)).await;
    // Window 1.
    clock.advance(Duration::from_millis(1000));
    complete(&store, &key("mid-done")).await;
    // Window 3.
    clock.advance(Duration::from_millis(2000));
    complete(&store, &key("recent-done")).await;
    // Window 4, 500 ms in: retention 2 s puts the cutoff in window 2.
    clock.advance(Duration::from_millis(1500));
    let t0 = clock.now().as_millis() - 4500;
    let slot_at = |ms: i64| ((t0 + ms) / WINDOW_MS % 5) as i16;
    let live_before = store.get(&live.key).await.expect("get");
    let recent_before = store.get(&key("recent-done")).await.expect("get");

    let counted = store
        .count_purgeable(Duration::from_secs(2))
        .await
        .expect("count");
    let report = purge(&store, Duration::from_secs(2)).await;
    assert_eq!(
        (counted.completed, counted.expired),
        (report.completed, report.expired),
        "the count says what the purge removes"
    );
    assert_eq!(
        (report.completed, report.expired),
        (2, 1),
        "old-done and mid-done (completed), old-expired (expired): {report:?}"
    );
    for gone in ["old-done", "old-expired", "mid-done"] {
        assert!(
            store.get(&key(gone)).await.expect("get").is_none(),
            "{gone}"
        );
    }
    assert_eq!(store.get(&live.key).await.expect("get"), live_before);
    assert_eq!(
        store.get(&key("recent-done")).await.expect("get"),
        recent_before
    );
    assert_eq!(
        rows_per_slot(&store).await,
        {
            let mut expected = vec![(slot_at(3000), 1), (slot_at(4500), 1)];
            expected.sort();
            expected
        },
        "recent-done in window 3's partition, the live lease moved to window 4's"
    );
    let run = store
        .last_purge()
        .await
        .expect("last purge")
        .expect("a run kept");
    assert_eq!((run.removed, run.stopped_early), (3, false), "{run:?}");
    let again = purge(&store, Duration::from_secs(2)).await;
    assert_eq!((again.completed, again.expired), (0, 0), "{again:?}");
    store
        .commit(&live, Some(b"done"))
        .await
        .expect("the moved lease commits");
    assert!(matches!(
        store
            .claim(&live.key, &ClaimOptions::lease(Duration::from_secs(1)))
            .await,
        Ok(Claim::Completed { .. })
    ));
}

/// A record is kept at least the retention, and at most the retention and one window.
#[tokio::test]
async fn a_record_is_kept_between_the_retention_and_one_window_more() {
    let url = crate::url_or_skip!();
    let clock = aligned_clock();
    let store = ring_store(&url, "retire_bounds", &clock).await;
    let retention = Duration::from_millis(1500);
    // Completed 999 ms into window 0: its window ends 1 ms later.
    clock.advance(Duration::from_millis(999));
    complete(&store, &key("late-in-window")).await;
    // The retention since the commit has passed; its window's end not yet by the retention.
    clock.advance(retention);
    assert_eq!(
        purge(&store, retention).await.completed,
        0,
        "kept: window not over"
    );
    assert!(
        store
            .get(&key("late-in-window"))
            .await
            .expect("get")
            .is_some()
    );
    // The retention after the window's end.
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        purge(&store, retention).await.completed,
        1,
        "removed once its window is"
    );
    assert!(
        store
            .get(&key("late-in-window"))
            .await
            .expect("get")
            .is_none()
    );
}

/// A retention the ring cannot keep is refused before anything is removed.
#[tokio::test]
async fn a_retention_longer_than_the_ring_keeps_is_refused() {
    let url = crate::url_or_skip!();
    let clock = aligned_clock();
    let store = ring_store(&url, "retire_too_long", &clock).await;
    complete(&store, &key("kept")).await;
    // Window 4: window 0 ended 3 s ago, and the ring (5 windows) has not come back to it.
    clock.advance(Duration::from_secs(4));
    let refused = store
        .purge(&PurgeOptions::older_than(Duration::from_millis(3001)).unpaced())
        .await;
    assert!(
        matches!(
            &refused,
            Err(Error::InvalidInput {
                what: "retention",
                ..
            })
        ),
        "{refused:?}"
    );
    let count = store.count_purgeable(Duration::from_millis(3001)).await;
    assert!(
        matches!(
            &count,
            Err(Error::InvalidInput {
                what: "retention",
                ..
            })
        ),
        "{count:?}"
    );
    assert!(store.get(&key("kept")).await.expect("get").is_some());
    assert_eq!(purge(&store, Duration::from_secs(3)).await.completed, 1);
}

/// A table is opened only with the layout it was created with.
#[tokio::test]
async fn a_table_opens_only_with_its_own_layout() {
    let url = crate::url_or_skip!();
    let ring_table = common::unique_table("layout_ring");
    let plain_table = common::unique_table("layout_plain");
    let ring = common::config_with(&ring_table, common::ring(1000, 5));
    PostgresStore::connect_with(&url, ring.clone())
        .await
        .expect("create the ring");
    let mut plain = ring.clone();
    plain.partitions = None;
    let mut other = ring.clone();
    other.partitions = Some(common::ring(2000, 5));
    let mut fewer = ring.clone();
    fewer.partitions = Some(common::ring(1000, 4));
    for (what, config) in [
        ("plain", plain),
        ("another window", other),
        ("another count", fewer),
    ] {
        for migrate in [true, false] {
            let mut config = config.clone();
            config.migrate = migrate;
            let opened = PostgresStore::connect_with(&url, config).await;
            assert!(
                matches!(&opened, Err(e) if e.to_string().contains("partition")),
                "{what}, migrate {migrate}: {opened:?}"
            );
        }
    }
    let mut plain_config = ring.clone();
    plain_config.partitions = None;
    plain_config.sql.table = plain_table.clone();
    PostgresStore::connect_with(&url, plain_config)
        .await
        .expect("create a plain table");
    let ring_on_plain = common::config_with(&plain_table, common::ring(1000, 5));
    let opened = PostgresStore::connect_with(&url, ring_on_plain).await;
    assert!(
        matches!(&opened, Err(e) if e.to_string().contains("plain layout")),
        "{opened:?}"
    );
}

/// Claims of fresh keys run while partitions are retired under them, on the server's
/// clock with windows of 50 ms: every key is acquired exactly once, and every record
/// written within the retention is still there after the last purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_racing_retirement_lose_nothing_within_retention() {
    let url = crate::url_or_skip!();
    let mut config = common::config_with(&common::unique_table("retire_race"), common::ring(50, 8));
    config.max_connections = 8;
    let store = PostgresStore::connect_with(&url, config)
        .await
        .expect("connect");
    let retention = Duration::from_millis(200);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let purger = {
        let (store, done) = (store.clone(), done.clone());
        tokio::spawn(async move {
            let mut removed = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                removed += purge(&store, retention).await.completed;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            removed
        })
    };
    let mut workers = Vec::new();
    for w in 0..4 {
        let store = store.clone();
        workers.push(tokio::spawn(async move {
            let mut keys = Vec::new();
            for i in 0..150 {
                let k = key(&format!("w{w}-{i}"));
                // Each key claimed twice at once: exactly one acquires.
                let options = ClaimOptions::lease(Duration::from_secs(5));
                let (a, b) = tokio::join!(store.claim(&k, &options), store.claim(&k, &options));
                let leases: Vec<Lease> = [a.expect("claim"), b.expect("claim")]
                    .into_iter()
                    .filter_map(|c| c.lease().cloned())
                    .collect();
                assert_eq!(leases.len(), 1, "{k}: one acquisition");
                store.commit(&leases[0], None).await.expect("commit");
                keys.push((k, std::time::Instant::now()));
            }
            keys
        }));
    }
    let mut keys = Vec::new();
    for w in workers {
        keys.extend(w.await.expect("worker"));
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let removed = purger.await.expect("purger");
    assert!(removed > 0, "the purges retired nothing during the run");
    let checked = std::time::Instant::now();
    let last = purge(&store, retention).await;
    let mut kept = 0;
    for (k, committed) in &keys {
        // Committed (on the server) less than the retention before the last purge.
        if checked.duration_since(*committed) < retention - Duration::from_millis(20) {
            assert!(
                store.get(k).await.expect("get").is_some(),
                "{k} lost within retention"
            );
            kept += 1;
        }
    }
    assert!(kept > 0, "no record was recent enough to check: {last:?}");
}

/// A claim inside a REPEATABLE READ transaction is refused: its look-up of the partitions
/// would read the transaction's old snapshot. READ COMMITTED claims.
#[tokio::test]
async fn a_claim_in_a_repeatable_read_transaction_is_refused() {
    let url = crate::url_or_skip!();
    let clock = aligned_clock();
    let store = ring_store(&url, "retire_rr", &clock).await;
    let mut tx = store.pool().begin().await.expect("begin");
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *tx)
        .await
        .expect("isolation");
    let refused = store.claim_in_tx(&mut tx, &key("rr"), None).await;
    assert!(
        matches!(&refused, Err(e) if format!("{e:?}").contains("REPEATABLE READ")),
        "{refused:?}"
    );
    drop(tx);
    let mut tx = store.pool().begin().await.expect("begin");
    let claimed = store.claim_in_tx(&mut tx, &key("rr"), None).await;
    assert!(
        matches!(claimed, Ok(dedup_core::TxClaim::Claimed { fence: 1 })),
        "{claimed:?}"
    );
}

/// A claim of one key looks the key up through each partition's index, on a table still
/// empty too. The claim function's one-key statements keep their plans from call to call:
/// a plan made for an empty table and kept (as a forced generic plan would be) reads whole
/// partitions, at a cost that grows with the table.
#[tokio::test]
async fn a_claim_looks_its_key_up_through_the_index() {
    let url = crate::url_or_skip!();
    let clock = aligned_clock();
    let store = ring_store(&url, "retire_plans", &clock).await;
    let table = store.config().sql.table.clone();
    let mut tx = store.pool().begin().await.expect("begin");
    for i in 0..20 {
        let claimed = store
            .claim_in_tx(&mut tx, &key(&format!("indexed-{i}")), None)
            .await;
        assert!(
            matches!(claimed, Ok(dedup_core::TxClaim::Claimed { fence: 1 })),
            "{claimed:?}"
        );
    }
    // This transaction's own reads of the partitions, as the server counts them.
    let (seq_scans, index_scans): (i64, i64) = sqlx::query_as(
        "SELECT coalesce(sum(seq_scan), 0)::bigint, coalesce(sum(idx_scan), 0)::bigint \
         FROM pg_stat_xact_user_tables WHERE schemaname = $1 AND relname LIKE $2",
    )
    .bind(common::SCHEMA)
    .bind(format!("{table}\\_p%"))
    .fetch_one(&mut *tx)
    .await
    .expect("the transaction's scans");
    assert_eq!(seq_scans, 0, "claims read whole partitions");
    assert!(
        index_scans >= 20 * 5,
        "{index_scans} index scans for 20 claims"
    );
}

/// A retirement whose partition is in use does not queue its lock request in front of
/// the claims: it asks again and again without waiting, so a claim (which reads every
/// partition) goes on while a reader holds the partition, and the truncate runs once the
/// reader is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_do_not_queue_behind_a_truncate_waiting_for_its_lock() {
    let url = crate::url_or_skip!();
    let clock = aligned_clock();
    let store = ring_store(&url, "retire_no_queue", &clock).await;
    complete(&store, &key("old-done")).await;
    let [(slot, 1)] = rows_per_slot(&store).await[..] else {
        panic!("one row in one partition");
    };
    // Window 4, 500 ms in: window 0 is past a 2 s retention.
    clock.advance(Duration::from_millis(4500));

    // A reader holds window 0's partition (ACCESS SHARE) in an open transaction.
    let mut reader = store.pool().begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {} WHERE slot = $1",
        store.table()
    )))
    .bind(slot)
    .execute(&mut *reader)
    .await
    .expect("read the partition");
    let purging = {
        let store = store.clone();
        tokio::spawn(async move { purge(&store, Duration::from_secs(2)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await; // the purge is at its lock

    let started = std::time::Instant::now();
    complete(&store, &key("new")).await;
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_millis(600),
        "a claim and commit took {waited:?}: they queued behind the truncate's lock request"
    );
    assert!(!purging.is_finished(), "the truncate waits for the reader");
    reader.commit().await.expect("end the read");
    let report = purging.await.expect("purge task");
    assert_eq!((report.completed, report.expired), (1, 0), "{report:?}");
    assert!(store.get(&key("old-done")).await.expect("get").is_none());
}

/// A transaction holding a partition other than `busy` under `ACCESS EXCLUSIVE`, as a
/// truncate holds the partition it retires.
async fn lock_a_third_partition(
    store: &PostgresStore,
    busy: [i16; 2],
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let other = (0..5)
        .find(|s| !busy.contains(s))
        .expect("a third partition");
    let mut locker = store.pool().begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE {}_p{other}\" IN ACCESS EXCLUSIVE MODE",
        store.table().trim_end_matches('"')
    )))
    .execute(&mut *locker)
    .await
    .expect("lock a third partition");
    locker
}

/// A holder's commit names the partition of its window. While another session holds a
/// third partition locked (as a truncate locks the partition it retires), a lease claimed
/// in this window commits without waiting. A lease claimed in the window before misses
/// that first try and commits through the update over every partition, which moves its
/// row to the current partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_names_the_partition_of_its_window() {
    let url = crate::url_or_skip!();
    let clock = aligned_clock();
    let store = ring_store(&url, "commit_here", &clock).await;
    let before = acquire(&store, &key("before"), Duration::from_secs(30)).await;
    clock.advance(Duration::from_millis(WINDOW_MS as u64));
    let now = acquire(&store, &key("now"), Duration::from_secs(30)).await;
    let [(a, 1), (b, 1)] = rows_per_slot(&store).await[..] else {
        panic!("one row in each of two partitions");
    };
    let locker = lock_a_third_partition(&store, [a, b]).await;
    let committed = tokio::time::timeout(Duration::from_secs(2), store.commit(&now, None)).await;
    locker.rollback().await.expect("unlock");
    committed
        .expect("a commit in its own window waited for another partition's lock")
        .expect("commit");

    store
        .commit(&before, None)
        .await
        .expect("commit a lease of the window before");
    let current = rows_per_slot(&store).await;
    assert_eq!(
        current.len(),
        1,
        "both rows in the current partition: {current:?}"
    );
    assert_eq!(current[0].1, 2, "{current:?}");
    for k in ["before", "now"] {
        let record = store.get(&key(k)).await.expect("get").expect("record");
        assert!(
            matches!(record.state, dedup_core::RecordState::Completed { .. }),
            "{k}: {record:?}"
        );
    }
}

/// The batch commit's first round names the partition of its window too: with a third
/// partition locked, two leases of this window commit without waiting. Then a batch with a
/// lease of this window and one of the window before commits both, the second in a round
/// over every partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_commit_names_the_partition_of_its_window() {
    let url = crate::url_or_skip!();
    let clock = aligned_clock();
    let store = ring_store(&url, "commit_many_here", &clock).await;
    let before = acquire(&store, &key("before"), Duration::from_secs(30)).await;
    clock.advance(Duration::from_millis(WINDOW_MS as u64));
    let leases = [
        acquire(&store, &key("now-1"), Duration::from_secs(30)).await,
        acquire(&store, &key("now-2"), Duration::from_secs(30)).await,
        acquire(&store, &key("now-3"), Duration::from_secs(30)).await,
    ];
    let slots = rows_per_slot(&store).await;
    let (Some(&(a, _)), Some(&(b, _))) = (
        slots.iter().find(|(_, n)| *n == 1),
        slots.iter().find(|(_, n)| *n == 3),
    ) else {
        panic!("one row in the window before, three in this one: {slots:?}");
    };
    let locker = lock_a_third_partition(&store, [a, b]).await;
    let requests: Vec<CommitRequest> = leases[..2]
        .iter()
        .map(|lease| CommitRequest {
            lease: lease.clone(),
            outcome: None,
        })
        .collect();
    let committed =
        tokio::time::timeout(Duration::from_secs(2), store.commit_many(&requests)).await;
    locker.rollback().await.expect("unlock");
    for result in committed
        .expect("a batch commit in its own window waited for another partition's lock")
        .expect("commit_many")
    {
        result.expect("committed");
    }

    let requests: Vec<CommitRequest> = [&leases[2], &before]
        .into_iter()
        .map(|lease| CommitRequest {
            lease: lease.clone(),
            outcome: None,
        })
        .collect();
    for result in store.commit_many(&requests).await.expect("commit_many") {
        result.expect("committed");
    }
    let current = rows_per_slot(&store).await;
    assert_eq!(current, vec![(b, 4)], "every row in the current partition");
    for k in ["before", "now-1", "now-2", "now-3"] {
        let record = store.get(&key(k)).await.expect("get").expect("record");
        assert!(
            matches!(record.state, dedup_core::RecordState::Completed { .. }),
            "{k}: {record:?}"
        );
    }
}
