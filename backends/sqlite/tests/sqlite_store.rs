//! What is particular to SQLite: configuration and schema, lock waits and busy errors,
//! the executor staying free, in-memory stores, deferred caller transactions, the
//! transactional inbox's settings.

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dedup_core::{
    Capabilities, Claim, ClaimOptions, DedupStore, Error, InboxConfig, Key, RecordState, TxClaim,
};
use dedup_sqlite::rusqlite::{self, Connection, TransactionBehavior};
use dedup_sqlite::{SCHEMA_VERSIONS_TABLE, SqliteConfig, SqliteStore, Synchronous, TxInbox};

fn key(id: &str) -> Key {
    Key::new("billing", id).expect("key")
}

fn opts() -> ClaimOptions {
    ClaimOptions::lease(Duration::from_secs(30))
}

/// A plain connection (not the store's) holding the write lock of `db` until told to let go.
struct LockHolder {
    release: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl LockHolder {
    fn hold(db: &Path) -> Self {
        let db = db.to_path_buf();
        let (locked_tx, locked_rx) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let conn = Connection::open(db).expect("open");
            conn.execute_batch("BEGIN IMMEDIATE").expect("lock");
            locked_tx.send(()).expect("signal");
            release_rx.recv().ok();
            conn.execute_batch("COMMIT").expect("unlock");
        });
        locked_rx.recv().expect("locked");
        LockHolder { release, thread }
    }

    fn release(self) {
        self.release.send(()).expect("release");
        self.thread.join().expect("holder thread");
    }
}

#[tokio::test]
async fn an_unsafe_table_name_is_rejected_before_the_file_is_touched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("never.db");
    for table in [
        "x; DROP TABLE y",
        "a\"b",
        "",
        "sqlite_stat1",
        SCHEMA_VERSIONS_TABLE,
    ] {
        let err = SqliteStore::open_with(&db, SqliteConfig::with_table(table))
            .await
            .unwrap_err();
        assert!(err.is_invalid_input(), "{table:?}: {err:?}");
    }
    assert!(!db.exists(), "nothing was created");
}

#[tokio::test]
async fn a_file_store_is_persistent_shareable_transactional_and_in_wal_mode() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("caps.db");
    for (synchronous, level) in [(Synchronous::Full, 2), (Synchronous::Normal, 1)] {
        let config = SqliteConfig {
            synchronous,
            ..SqliteConfig::default()
        };
        let store = SqliteStore::open_with(&db, config).await.expect("open");
        assert_eq!(store.path(), Some(db.as_path()));
        assert_eq!(store.table(), "dedup_inbox");
        assert_eq!(
            store.capabilities(),
            Capabilities {
                persistent: true,
                multi_process: true,
                native_batch: true,
                transactional: true,
                first_claim_time: true,
                failure_causes: true,
                ..Capabilities::default()
            }
        );
        let conn = store.open_connection().expect("connection");
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .expect("journal_mode");
        let sync: i64 = conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .expect("synchronous");
        assert_eq!((mode.as_str(), sync), ("wal", level), "{synchronous:?}");
    }
}

#[tokio::test]
async fn tables_in_one_file_are_independent_and_versioned_separately() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("shared.db");
    let a = SqliteStore::open_with(&db, SqliteConfig::with_table("inbox_a"))
        .await
        .expect("open a");
    // A name the first table's index names could collide with (SQLite's tables and
    // indexes share one namespace).
    let b = SqliteStore::open_with(&db, SqliteConfig::with_table("inbox_a_purge"))
        .await
        .expect("open b");
    assert!(
        a.claim(&key("m1"), &opts())
            .await
            .expect("claim a")
            .is_acquired()
    );
    assert!(
        b.claim(&key("m1"), &opts())
            .await
            .expect("claim b")
            .is_acquired()
    );
    let conn = a.open_connection().expect("connection");
    let versions: Vec<(String, i64)> = conn
        .prepare(&format!(
            "SELECT table_name, version FROM {SCHEMA_VERSIONS_TABLE} ORDER BY table_name"
        ))
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .collect::<rusqlite::Result<_>>()
        .expect("rows");
    assert_eq!(
        versions,
        vec![
            ("inbox_a".into(), 5),
            ("inbox_a_outbox".into(), 1),
            ("inbox_a_purge".into(), 5),
            ("inbox_a_purge_outbox".into(), 1),
        ],
        "each store's records and outbox tables are versioned on their own"
    );
    let user_version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("user_version");
    assert_eq!(
        user_version, 0,
        "PRAGMA user_version is left to the application"
    );
}

#[tokio::test]
async fn a_lock_held_past_the_busy_timeout_is_a_retryable_error_never_a_duplicate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("busy.db");
    let config = SqliteConfig {
        busy_timeout: Duration::from_millis(200),
        ..SqliteConfig::default()
    };
    let store = SqliteStore::open_with(&db, config).await.expect("open");
    let holder = LockHolder::hold(&db);
    let started = Instant::now();
    let err = store.claim(&key("m1"), &opts()).await.unwrap_err();
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "waited the busy timeout"
    );
    assert!(err.is_retryable(), "{err:?}");
    let Error::Backend { source, .. } = &err else {
        panic!("a busy database is a backend error: {err:?}");
    };
    let code = source
        .downcast_ref::<rusqlite::Error>()
        .and_then(rusqlite::Error::sqlite_error_code);
    assert_eq!(code, Some(rusqlite::ErrorCode::DatabaseBusy), "source kept");
    holder.release();

    assert_eq!(
        store.get(&key("m1")).await.expect("get"),
        None,
        "nothing written"
    );
    assert!(
        store
            .claim(&key("m1"), &opts())
            .await
            .expect("retry")
            .is_acquired()
    );
}

#[tokio::test]
async fn an_operation_waits_for_a_lock_released_within_the_busy_timeout() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("wait.db");
    let store = SqliteStore::open(&db).await.expect("open");
    let holder = LockHolder::hold(&db);
    let claim = tokio::spawn({
        let store = store.clone();
        async move { store.claim(&key("m1"), &opts()).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!claim.is_finished(), "the claim waits for the lock");
    holder.release();
    let claim = claim.await.expect("join").expect("claim after the wait");
    assert!(claim.is_acquired());
}

#[tokio::test(flavor = "current_thread")]
async fn blocking_sqlite_calls_do_not_stall_the_executor() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("executor.db");
    let store = SqliteStore::open(&db).await.expect("open");
    let holder = LockHolder::hold(&db);
    // On this runtime's single thread: a claim stuck behind the lock, and a ticking task.
    let claim = tokio::spawn({
        let store = store.clone();
        async move { store.claim(&key("m1"), &opts()).await }
    });
    let started = Instant::now();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the executor thread kept running while SQLite waited: {:?}",
        started.elapsed()
    );
    assert!(
        !claim.is_finished(),
        "the claim is still waiting for the lock"
    );
    holder.release();
    assert!(claim.await.expect("join").expect("claim").is_acquired());
}

#[tokio::test]
async fn an_in_memory_store_keeps_the_contract_but_shares_nothing() {
    let store = SqliteStore::open_in_memory().await.expect("open");
    assert_eq!(store.path(), None);
    assert_eq!(
        store.capabilities(),
        Capabilities {
            native_batch: true,
            first_claim_time: true,
            failure_causes: true,
            ..Capabilities::default()
        }
    );
    let lease = store
        .claim(&key("m1"), &opts())
        .await
        .expect("claim")
        .into_lease()
        .expect("acquired");
    assert!(matches!(
        store.claim(&key("m1"), &opts()).await.expect("claim"),
        Claim::InFlight { .. }
    ));
    store.commit(&lease, Some(b"ok")).await.expect("commit");
    let record = store.get(&key("m1")).await.expect("get").expect("record");
    assert!(matches!(record.state, RecordState::Completed { .. }));
    let other = SqliteStore::open_in_memory().await.expect("open");
    assert_eq!(other.get(&key("m1")).await.expect("get"), None, "private");
    assert!(matches!(
        store.open_connection(),
        Err(Error::Unsupported(_))
    ));
}

/// The transactional claim writes before it reads, so a claim as the first statement of a
/// *deferred* transaction waits for a concurrent claimer like an immediate one would.
#[tokio::test]
async fn deferred_caller_transactions_wait_for_each_other_and_see_the_outcome() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("deferred.db");
    let store = SqliteStore::open(&db).await.expect("open");
    for (end_first, expected_second) in [
        (
            "COMMIT",
            TxClaim::Completed {
                processed_at: dedup_core::Timestamp::EPOCH,
                outcome: None,
            },
        ),
        ("ROLLBACK", TxClaim::Claimed { fence: 1 }),
    ] {
        let k = key(end_first);
        let (claimed_tx, claimed_rx) = mpsc::channel();
        let (end_tx, end_rx) = mpsc::channel::<()>();
        let first = std::thread::spawn({
            let (store, k) = (store.clone(), k.clone());
            move || {
                let mut conn = store.open_connection().expect("connection");
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Deferred)
                    .expect("begin");
                let claim = store.claim_in_tx(&tx, &k, None).expect("first claim");
                claimed_tx.send(claim).expect("signal");
                end_rx.recv().ok();
                match end_first {
                    "COMMIT" => tx.commit(),
                    _ => tx.rollback(),
                }
                .expect("end first");
            }
        });
        assert_eq!(
            claimed_rx.recv().expect("first"),
            TxClaim::Claimed { fence: 1 }
        );
        let second = std::thread::spawn({
            let (store, k) = (store.clone(), k.clone());
            move || {
                let mut conn = store.open_connection().expect("connection");
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Deferred)
                    .expect("begin");
                let claim = store.claim_in_tx(&tx, &k, None).expect("second claim");
                tx.commit().expect("commit second");
                claim
            }
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !second.is_finished(),
            "the second claim waits for the first"
        );
        end_tx.send(()).expect("end");
        first.join().expect("first thread");
        let second = second.join().expect("second thread");
        match (&second, &expected_second) {
            (TxClaim::Completed { outcome, .. }, TxClaim::Completed { .. }) => {
                assert_eq!(outcome, &None)
            }
            _ => assert_eq!(second, expected_second, "after {end_first}"),
        }
    }
}

/// A claim that arrives while a purge batch holds the write lock runs before the purge's
/// next batch: the store's writers queue first come, first served, so a claim never waits
/// behind more than one batch. Proven by a record the second batch would remove: the claim
/// takes it over (fence 2) before that batch can run (it would otherwise find it gone and
/// start at fence 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_waits_behind_at_most_one_purge_batch() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("pacing.db");
    let clock = std::sync::Arc::new(dedup_core::ManualClock::starting_now());
    let config = SqliteConfig {
        clock: Some(clock.clone()),
        ..SqliteConfig::default()
    };
    let store = SqliteStore::open_with(&db, config).await.expect("open");
    // First batch: 100 completed records (the purge statement takes completed rows first).
    for i in 0..100 {
        let k = key(&format!("old-{i}"));
        let lease = store
            .claim(&k, &opts())
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        store.commit(&lease, None).await.unwrap();
    }
    // Second batch: one abandoned lease.
    let victim = key("abandoned");
    let short = ClaimOptions::lease(Duration::from_secs(1));
    assert!(store.claim(&victim, &short).await.unwrap().is_acquired());
    clock.advance(Duration::from_secs(7200));

    let holder = LockHolder::hold(&db);
    let purging = {
        let store = store.clone();
        let options = dedup_core::PurgeOptions::older_than(Duration::from_secs(3600))
            .batch_size(100)
            .unpaced();
        tokio::spawn(async move { store.purge(&options).await })
    };
    // The first batch takes the store's write gate and waits for SQLite's lock.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let claiming = {
        let store = store.clone();
        let victim = victim.clone();
        tokio::spawn(async move { store.claim(&victim, &opts()).await })
    };
    // The claim queues at the gate behind the first batch.
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.release();

    let claim = claiming.await.unwrap().expect("claim");
    match claim {
        Claim::Acquired(lease) => assert_eq!(
            (lease.fence, lease.attempt),
            (2, 2),
            "the claim ran before the second purge batch"
        ),
        other => panic!("expected a takeover, got {other:?}"),
    }
    let report = purging.await.unwrap().expect("purge");
    assert_eq!(
        (report.completed, report.expired),
        (100, 0),
        "the taken-over lease is live again, so the second batch found nothing: {report:?}"
    );
}

/// Start `claim(key)` in the background.
fn spawn_claim(
    store: &SqliteStore,
    key: Key,
) -> tokio::task::JoinHandle<dedup_core::Result<Claim>> {
    let store = store.clone();
    tokio::spawn(async move { store.claim(&key, &opts()).await })
}

/// Bytes of `db`'s write-ahead log (it only grows until a checkpoint, which a fresh
/// database reaches after 1000 pages).
fn wal_len(db: &Path) -> u64 {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0)
}

/// `store`'s write queue held up: another connection holds SQLite's write lock, and a first
/// claim has taken the store's gate and waits for it, so later writes queue behind it.
struct QueueHeld {
    holder: LockHolder,
    first: tokio::task::JoinHandle<dedup_core::Result<Claim>>,
}

impl QueueHeld {
    async fn hold(db: &Path, store: &SqliteStore) -> Self {
        let holder = LockHolder::hold(db);
        let first = spawn_claim(store, key("first"));
        tokio::time::sleep(Duration::from_millis(200)).await;
        QueueHeld { holder, first }
    }

    /// Let go of the lock; the first claim (and what queued behind it) then runs.
    async fn release(self) {
        self.holder.release();
        assert!(self.first.await.unwrap().unwrap().is_acquired());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_share_one_transaction_and_keep_their_order() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("group.db");
    let store = SqliteStore::open(&db).await.expect("open");
    assert!(
        store
            .claim(&key("warm"), &opts())
            .await
            .unwrap()
            .is_acquired()
    );

    // The first write takes the gate alone and waits for SQLite's lock...
    let held = QueueHeld::hold(&db, &store).await;
    // ... while these queue behind it, a key claimed twice among them.
    let mut queued = Vec::new();
    for i in 0..20 {
        queued.push(spawn_claim(&store, key(&format!("k{i}"))));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let again = spawn_claim(&store, key("k3"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let wal_before = wal_len(&db);
    held.release().await;

    for claim in queued {
        assert!(claim.await.unwrap().unwrap().is_acquired());
    }
    // The second claim of k3 ran after the first, in the same order as they queued.
    match again.await.unwrap().unwrap() {
        Claim::InFlight { attempt, .. } => assert_eq!(attempt, 1),
        other => panic!("expected k3 in flight, got {other:?}"),
    }
    // 22 inserts (3 pages each: the table and two purge indexes) written as 22
    // transactions would add ~66 pages to the log; grouped, each page is written once
    // per transaction: the first write's and the group's.
    let pages = (wal_len(&db) - wal_before) / (4096 + 24);
    assert!(
        pages < 22,
        "{pages} log pages for 22 writes: the queued writes did not share a transaction"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_write_in_a_group_fails_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("group-fail.db");
    let clock = std::sync::Arc::new(dedup_core::ManualClock::starting_now());
    let config = SqliteConfig {
        clock: Some(clock.clone()),
        ..SqliteConfig::default()
    };
    let store = SqliteStore::open_with(&db, config).await.expect("open");
    let short = ClaimOptions::lease(Duration::from_secs(1));
    let lost = store
        .claim(&key("taken"), &short)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    clock.advance(Duration::from_secs(2));
    assert!(
        store
            .claim(&key("taken"), &opts())
            .await
            .unwrap()
            .is_acquired()
    );

    let held = QueueHeld::hold(&db, &store).await;
    let before = spawn_claim(&store, key("before"));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let renew = {
        let store = store.clone();
        tokio::spawn(async move { store.renew(&lost, Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let after = spawn_claim(&store, key("after"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.release().await;

    assert!(matches!(renew.await.unwrap(), Err(Error::LeaseLost { .. })));
    assert!(before.await.unwrap().unwrap().is_acquired());
    assert!(after.await.unwrap().unwrap().is_acquired());
    for id in ["before", "after"] {
        let record = store.get(&key(id)).await.unwrap().expect("written");
        assert!(matches!(record.state, RecordState::InFlight { .. }), "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_given_up_while_queued_never_runs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("group-cancel.db");
    let store = SqliteStore::open(&db).await.expect("open");

    let held = QueueHeld::hold(&db, &store).await;
    let given_up = tokio::time::timeout(
        Duration::from_millis(100),
        store.claim(&key("gone"), &opts()),
    )
    .await;
    assert!(given_up.is_err(), "the claim was queued behind the lock");
    held.release().await;
    // A later write takes whatever is queued: the abandoned claim is dropped, not run.
    assert!(
        store
            .claim(&key("later"), &opts())
            .await
            .unwrap()
            .is_acquired()
    );
    assert_eq!(store.get(&key("gone")).await.unwrap(), None);
}

#[tokio::test]
async fn a_tx_inbox_answers_the_configuration_it_was_given() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("app.db")).await.unwrap();
    let config = InboxConfig {
        lease: Duration::from_secs(7),
        max_attempts: Some(3),
        ..InboxConfig::default()
    };
    let inbox = TxInbox::new(store).with_config(config.clone());
    assert_eq!(inbox.config(), &config);
}
