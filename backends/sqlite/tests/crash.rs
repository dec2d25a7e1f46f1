//! Crashes: a process killed between claim and commit, a process killed inside an open
//! transaction, and a store dropped mid-work. The lease holds the key until it expires and
//! is then taken over; committed records survive; an uncommitted transaction leaves
//! nothing behind.
//!
//! The crashing processes are this test binary started again in child mode (`child_entry`,
//! `#[ignore]`d so a normal run only starts it through the tests below). Every process uses
//! a manual clock set from the parent, so expiry is exact and nothing sleeps.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use dedup_core::{
    Claim, ClaimOptions, DedupStore, Key, ManualClock, RecordState, Timestamp, TxClaim,
};
use dedup_sqlite::rusqlite::TransactionBehavior;
use dedup_sqlite::{SqliteConfig, SqliteStore};

const ENV_MODE: &str = "DEDUP_SQLITE_CRASH_MODE";
const ENV_DB: &str = "DEDUP_SQLITE_CRASH_DB";
const ENV_NOW: &str = "DEDUP_SQLITE_CRASH_NOW";
const LEASE: Duration = Duration::from_secs(10);
/// The manual clock's start for every process of a test.
const T0: Timestamp = Timestamp::from_millis(1_700_000_000_000);

fn key(id: &str) -> Key {
    Key::new("crash", id).expect("key")
}

async fn open(db: &Path, clock: Arc<ManualClock>) -> SqliteStore {
    let config = SqliteConfig {
        clock: Some(clock),
        ..SqliteConfig::default()
    };
    SqliteStore::open_with(db, config).await.expect("open")
}

#[test]
#[ignore = "crashing child process of the tests in this file, started by them"]
fn child_entry() {
    let (Ok(mode), Ok(db)) = (std::env::var(ENV_MODE), std::env::var(ENV_DB)) else {
        eprintln!("child_entry only runs as a child of the crash tests");
        return;
    };
    let now: i64 = std::env::var(ENV_NOW).expect("now").parse().expect("now");
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(now)));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let store = open(Path::new(&db), clock).await;
        match mode.as_str() {
            "lease" => {
                let done = store
                    .claim(&key("done"), &ClaimOptions::lease(LEASE))
                    .await
                    .expect("claim done")
                    .into_lease()
                    .expect("acquired");
                store.commit(&done, Some(b"kept")).await.expect("commit");
                let lease = store
                    .claim(&key("work"), &ClaimOptions::lease(LEASE))
                    .await
                    .expect("claim work");
                assert!(lease.is_acquired());
            }
            "tx" => {
                let store = store.clone();
                tokio::task::spawn_blocking(move || {
                    let mut conn = store.open_connection().expect("connection");
                    let tx = conn
                        .transaction_with_behavior(TransactionBehavior::Immediate)
                        .expect("begin");
                    let claim = store.claim_in_tx(&tx, &key("tx"), None).expect("claim");
                    assert_eq!(claim, TxClaim::Claimed { fence: 1 });
                    tx.execute("CREATE TABLE business (x INTEGER)", [])
                        .expect("business write");
                    // Die with the transaction open and the write lock held.
                    std::process::abort();
                })
                .await
                .expect("join");
            }
            other => panic!("unknown mode {other}"),
        }
        // Die between claim and commit: no destructor, no close, no rollback.
        std::process::abort();
    });
}

/// Run the child in `mode` against `db` and check that it crashed (rather than exited).
fn crash_child(mode: &str, db: &Path) {
    let status = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "child_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV_MODE, mode)
        .env(ENV_DB, db)
        .env(ENV_NOW, T0.as_millis().to_string())
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run child");
    assert!(
        !status.success(),
        "the child must have aborted, it exited with {status}"
    );
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(6),
            "the child died of SIGABRT: {status}"
        );
    }
}

#[tokio::test]
async fn a_process_killed_between_claim_and_commit_loses_the_key_after_the_lease() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("crash.db");
    crash_child("lease", &db);

    let clock = Arc::new(ManualClock::new(T0.saturating_add(Duration::from_secs(1))));
    let store = open(&db, clock.clone()).await;

    // What the dead process committed survives it.
    let done = store.get(&key("done")).await.expect("get").expect("record");
    match done.state {
        RecordState::Completed { outcome, .. } => {
            assert_eq!(outcome.as_deref(), Some(&b"kept"[..]))
        }
        other => panic!("the committed record must survive: {other:?}"),
    }
    let duplicate = store.claim(&key("done"), &ClaimOptions::lease(LEASE)).await;
    assert!(
        matches!(duplicate, Ok(Claim::Completed { .. })),
        "{duplicate:?}"
    );

    // Its claim holds the key until the lease runs out...
    let expires_at = T0.saturating_add(LEASE);
    let claim = store
        .claim(&key("work"), &ClaimOptions::lease(LEASE))
        .await
        .expect("claim");
    assert_eq!(
        claim,
        Claim::InFlight {
            expires_at,
            attempt: 1
        }
    );
    clock.set(expires_at.saturating_sub(Duration::from_millis(1)));
    let claim = store
        .claim(&key("work"), &ClaimOptions::lease(LEASE))
        .await
        .expect("claim");
    assert!(matches!(claim, Claim::InFlight { .. }), "{claim:?}");

    // ...then it is taken over, and the new owner can finish the work.
    clock.set(expires_at);
    let lease = match store.claim(&key("work"), &ClaimOptions::lease(LEASE)).await {
        Ok(Claim::Acquired(lease)) => lease,
        other => panic!("the expired lease must be taken over: {other:?}"),
    };
    assert_eq!((lease.fence, lease.attempt), (2, 2));
    store
        .commit(&lease, Some(b"retried"))
        .await
        .expect("commit");
}

#[tokio::test]
async fn a_process_killed_inside_a_transaction_leaves_no_record() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("crash.db");
    crash_child("tx", &db);

    let clock = Arc::new(ManualClock::new(T0));
    let store = open(&db, clock).await;
    assert_eq!(
        store.get(&key("tx")).await.expect("get"),
        None,
        "rolled back by the crash"
    );

    // The dead process's write lock is gone and the key claims normally, at fence 1.
    let claimer = store.clone();
    let (claim, business_exists) = tokio::task::spawn_blocking(move || {
        let mut conn = claimer.open_connection().expect("connection");
        let business_exists: bool = conn
            .query_row(
                "SELECT count(*) > 0 FROM sqlite_master WHERE name = 'business'",
                [],
                |r| r.get(0),
            )
            .expect("schema");
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("begin");
        let claim = claimer.claim_in_tx(&tx, &key("tx"), None).expect("claim");
        tx.commit().expect("commit");
        (claim, business_exists)
    })
    .await
    .expect("join");
    assert!(
        !business_exists,
        "the dead transaction's business write is gone too"
    );
    assert_eq!(claim, TxClaim::Claimed { fence: 1 });
}

#[tokio::test]
async fn a_store_dropped_mid_work_keeps_the_lease_until_it_expires() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("dropped.db");
    let clock = Arc::new(ManualClock::new(T0));

    let store = open(&db, clock.clone()).await;
    let first = store
        .claim(&key("work"), &ClaimOptions::lease(LEASE))
        .await
        .expect("claim")
        .into_lease()
        .expect("acquired");
    drop(store);

    let store = open(&db, clock.clone()).await;
    let claim = store
        .claim(&key("work"), &ClaimOptions::lease(LEASE))
        .await
        .expect("claim");
    assert_eq!(
        claim,
        Claim::InFlight {
            expires_at: first.expires_at,
            attempt: 1
        }
    );
    clock.advance(LEASE);
    let second = store
        .claim(&key("work"), &ClaimOptions::lease(LEASE))
        .await
        .expect("claim")
        .into_lease()
        .expect("taken over");
    assert_eq!((second.fence, second.attempt), (2, 2));
    store.commit(&second, Some(b"")).await.expect("commit");
    let stale = store.commit(&first, Some(b"stale")).await.unwrap_err();
    assert!(stale.is_lease_lost(), "{stale:?}");
    drop(store);

    // The commit survives reopening, empty outcome and all.
    let store = open(&db, clock.clone()).await;
    let claim = store
        .claim(&key("work"), &ClaimOptions::lease(LEASE))
        .await
        .expect("claim");
    match claim {
        Claim::Completed { outcome, .. } => assert_eq!(outcome, Some(Vec::new())),
        other => panic!("the commit must survive reopening: {other:?}"),
    }
}
