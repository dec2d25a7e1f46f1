//! Kept counts (`Admin::enable_counts`) on the real MySQL / MariaDB of `DEDUP_MYSQL_URL`:
//! the mixed workload's counts equal a scan's, every admin clause holds with counts kept,
//! enabling while writers run misses no write, a read folds many rows of differences, and
//! disabling leaves the schema exactly as a store without counts has it.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dedup_conformance::clauses::KeptCounts;
use dedup_core::admin::ConsumerCounts;
use dedup_core::{Admin, ClaimOptions, DedupStore, Key, Lease, Status, TxClaim};
use dedup_mysql::MySqlStore;
use dedup_mysql::sqlx::{self, AssertSqlSafe};

type Store = MySqlStore;

#[path = "../../sql/tests/clauses/kept_counts.rs"]
mod shared;
use shared::Factory;

/// The lease-mode clauses on stores that keep counts: the triggers clear the insert id the
/// server reports, which the fast paths read (`last_insert_id` in `src/store.rs`).
mod lease_mode_with_counts_kept {
    use super::*;
    dedup_conformance::suite!(KeptCounts(Factory));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactional_claims_say_what_they_did_with_counts_kept() {
    let url = url_or_skip!();
    let clock = common::manual_clock();
    let store = common::store(&url, "kept_tx", Some(clock.clone())).await;
    assert!(store.enable_counts().await.expect("enable"));
    let claim = |key: Key| {
        let store = store.clone();
        async move {
            let mut tx = store.pool().begin().await.expect("begin");
            let claim = store.claim_in_tx(&mut tx, &key, None).await.expect("claim");
            tx.commit().await.expect("commit");
            claim
        }
    };
    let fresh = Key::new("tx", "fresh").unwrap();
    assert_eq!(
        claim(fresh.clone()).await,
        TxClaim::Claimed { fence: 1 },
        "a new key is claimed at fence 1"
    );
    assert!(
        matches!(claim(fresh).await, TxClaim::Completed { .. }),
        "a claimed key is a duplicate"
    );
    let expired = Key::new("tx", "expired").unwrap();
    store
        .claim(&expired, &ClaimOptions::lease(Duration::from_secs(1)))
        .await
        .expect("lease-mode claim");
    clock.advance(Duration::from_secs(2));
    assert_eq!(
        claim(expired).await,
        TxClaim::Claimed { fence: 2 },
        "an expired lease is taken over at the next fence"
    );
    let counts = store.consumers().await.expect("consumers");
    assert_eq!(by_status(&counts), [("tx".to_owned(), [0, 0, 2, 0, 0])]);
}

/// The tables, triggers and indexes of `store`'s database whose names start with its
/// table's (the triggers: those on its table).
async fn schema_objects(store: &MySqlStore) -> Vec<String> {
    let table = &store.config().table;
    let like = format!("{}%", table.replace('_', "\\_"));
    let sql = "SELECT CONCAT('table ', table_name) FROM information_schema.tables \
               WHERE table_schema = DATABASE() AND table_name LIKE ? \
               UNION ALL SELECT CONCAT('trigger ', trigger_name) FROM information_schema.triggers \
               WHERE trigger_schema = DATABASE() AND event_object_table = ? \
               UNION ALL SELECT DISTINCT CONCAT('index ', table_name, '.', index_name) \
               FROM information_schema.statistics \
               WHERE table_schema = DATABASE() AND table_name LIKE ? \
               ORDER BY 1";
    sqlx::query_scalar::<_, String>(AssertSqlSafe(sql))
        .bind(&like)
        .bind(table)
        .bind(&like)
        .fetch_all(store.pool())
        .await
        .expect("read the catalog")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disabling_leaves_the_schema_as_a_store_without_counts_has_it() {
    let url = url_or_skip!();
    let store = common::store(&url, "kept_schema", None).await;
    let before = schema_objects(&store).await;
    assert!(store.enable_counts().await.expect("enable"));
    let kept = schema_objects(&store).await;
    for added in [
        "_counts",
        "_counts_ins",
        "_counts_upd",
        "_counts_del",
        ".in_flight_idx",
    ] {
        assert!(
            kept.iter().any(|o| o.ends_with(added)) && !before.iter().any(|o| o.ends_with(added)),
            "enabling adds *{added}: {kept:?}"
        );
    }
    assert!(store.disable_counts().await.expect("disable"));
    assert_eq!(
        schema_objects(&store).await,
        before,
        "disabling removes everything enabling added"
    );
}

/// The lease of a claim of `key`, which has no record.
async fn claim_new(store: &MySqlStore, key: &Key) -> Lease {
    store
        .claim(key, &ClaimOptions::lease(Duration::from_secs(60)))
        .await
        .expect("claim")
        .into_lease()
        .expect("a new key")
}

/// The counts by status of each consumer, as comparable values.
fn by_status(consumers: &[ConsumerCounts]) -> Vec<(String, [u64; 5])> {
    consumers
        .iter()
        .map(|c| (c.consumer.clone(), Status::ALL.map(|s| c.counts.count(s))))
        .collect()
}

/// The records of `store` and the sum of its kept counts, in one snapshot.
async fn records_and_kept(store: &MySqlStore) -> (i64, i64) {
    let table = &store.config().table;
    let mut conn = store.pool().acquire().await.expect("connection");
    sqlx::raw_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; START TRANSACTION WITH CONSISTENT SNAPSHOT")
        .execute(&mut *conn)
        .await
        .expect("snapshot");
    let sql = format!(
        "SELECT CAST((SELECT COUNT(*) FROM `{table}`) AS SIGNED), \
         CAST((SELECT COALESCE(SUM(in_flight + completed + failed + dead_lettered), 0) \
         FROM `{table}_counts`) AS SIGNED)"
    );
    let counted = sqlx::query_as(AssertSqlSafe(sql))
        .fetch_one(&mut *conn)
        .await
        .expect("count both");
    sqlx::raw_sql("COMMIT")
        .execute(&mut *conn)
        .await
        .expect("end");
    counted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn enabling_while_writers_run_misses_no_write() {
    let url = url_or_skip!();
    let clock = common::manual_clock();
    let store = common::store(&url, "kept_racing", Some(clock.clone())).await;
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (store, stop) = (store.clone(), stop.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let key = Key::new(format!("w{w}"), format!("m{i}")).unwrap();
                    let lease = claim_new(&store, &key).await;
                    // One in three stays in flight; one is released, taken over (the
                    // locked path) and committed; one is committed and claimed again (a
                    // duplicate, read on the locked path).
                    let options = ClaimOptions::lease(Duration::from_secs(60));
                    match i % 3 {
                        0 => {}
                        1 => {
                            store.release(&lease).await.expect("release");
                            let again = store.claim(&key, &options).await.expect("takeover");
                            let lease = again.into_lease().expect("a released key");
                            store.commit(&lease, Some(b"ok")).await.expect("commit");
                        }
                        _ => {
                            store.commit(&lease, Some(b"ok")).await.expect("commit");
                            store.claim(&key, &options).await.expect("duplicate");
                        }
                    }
                    i += 1;
                }
                i
            })
        })
        .collect();
    for round in 0..4 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(store.enable_counts().await.expect("enable"));
        for _ in 0..3 {
            let (records, kept) = records_and_kept(&store).await;
            assert_eq!(
                kept, records,
                "round {round}: one snapshot, kept counts and records"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if round < 3 {
            assert!(store.disable_counts().await.expect("disable"));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut written = 0;
    for writer in writers {
        written += writer.await.expect("writer");
    }
    let kept = store.consumers().await.expect("kept counts");
    assert_eq!(
        kept.iter().map(|c| c.counts.total()).sum::<u64>(),
        written,
        "every record written is counted once"
    );
    assert!(store.disable_counts().await.expect("disable"));
    let scanned = store.consumers().await.expect("scan");
    assert_eq!(
        by_status(&kept),
        by_status(&scanned),
        "the kept counts equal a scan"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_folds_many_rows_of_differences_into_one_per_consumer() {
    let url = url_or_skip!();
    let store = common::store(&url, "kept_fold", None).await;
    assert!(store.enable_counts().await.expect("enable"));
    let n = 30;
    for i in 0..n {
        let lease = claim_new(&store, &Key::new("fold", format!("m{i}")).unwrap()).await;
        store.commit(&lease, Some(b"ok")).await.expect("commit");
    }
    // Rows of connections long gone: +1 and -1 processed, which cancel out.
    let kept = format!("`{}_counts`", store.config().table);
    let extra = dedup_sql::counts::FOLD_AFTER as usize + 10;
    let rows: Vec<String> = (0..extra)
        .map(|i| {
            let sign = if i % 2 == 0 { 1 } else { -1 };
            format!("('fold', {}, 0, {sign}, 0, 0)", 1_000_000 + i)
        })
        .collect();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {kept} VALUES {}",
        rows.join(", ")
    )))
    .execute(store.pool())
    .await
    .expect("rows of differences");
    let count_rows = || {
        let (pool, sql) = (store.pool().clone(), format!("SELECT COUNT(*) FROM {kept}"));
        async move {
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
                .fetch_one(&pool)
                .await
                .expect("count the rows of differences")
        }
    };
    assert!(count_rows().await > extra as i64);
    let counts = store.consumers().await.expect("consumers");
    assert_eq!(
        by_status(&counts),
        [("fold".to_owned(), [0, 0, n, 0, 0])],
        "the rows sum to the records"
    );
    assert_eq!(count_rows().await, 1, "the read folded them into one row");
    let again = store.consumers().await.expect("consumers after the fold");
    assert_eq!(
        by_status(&again),
        by_status(&counts),
        "folding changes no count"
    );
}
