//! A regression guard on the statements the transactional operations run on the caller's
//! connection: `claim_in_tx`, `commit_in_tx` and the outbox's `enqueue`, counted with SQLite's trace hook
//! (`trace_v2`, one `SQLITE_TRACE_PROFILE` event per statement run) on the connection the
//! test holds (see BENCHMARKS.md, "Wire cost guard"). SQLite has no network, so there are
//! no round trips to count. The lease-mode operations run on the store's own connection,
//! which a test cannot reach, so they are not counted here.
//!
//! Deterministic: the trace hook sees only this connection, and each operation runs once
//! on another key before it is measured.

use std::sync::atomic::{AtomicU64, Ordering};

use dedup_conformance::counting::{Cost, assert_cost};
use dedup_core::outbox::OutboxMessage;
use dedup_core::{Claim, ClaimOptions, DedupStore, Key, TxClaim};
use dedup_sqlite::SqliteStore;
use rusqlite::TransactionBehavior;
use rusqlite::trace::{TraceEvent, TraceEventCodes};

const BACKEND: &str = "sqlite";

/// The expected statements of each operation measured below (no round trips: no network).
const CLAIM_IN_TX: Cost = Cost::new(0, 1, 0);
const COMMIT_IN_TX: Cost = Cost::new(0, 1, 0);
/// `SAVEPOINT`, one `INSERT` per message, `RELEASE`.
const OUTBOX_ENQUEUE: Cost = Cost::new(0, 3, 0);

/// Statements run on the traced connection.
static STATEMENTS: AtomicU64 = AtomicU64::new(0);

fn count(event: TraceEvent<'_>) {
    if let TraceEvent::Profile(..) = event {
        STATEMENTS.fetch_add(1, Ordering::SeqCst);
    }
}

/// The statements `op` ran on the traced connection.
fn statements<T>(op: impl FnOnce() -> T) -> (T, Cost) {
    let before = STATEMENTS.load(Ordering::SeqCst);
    let out = op();
    let ran = STATEMENTS.load(Ordering::SeqCst) - before;
    (out, Cost::new(0, ran, 0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_operations_run_what_they_did() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("op_counts.db"))
        .await
        .expect("open");
    let mut conn = store.open_connection().expect("connection");
    conn.trace_v2(TraceEventCodes::SQLITE_TRACE_PROFILE, Some(count));
    let outbox = store.outbox();
    for (id, measured) in [("w1", false), ("a", true)] {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("begin");
        let key = Key::new("op-counts", id).unwrap();
        let (claim, cost) = statements(|| store.claim_in_tx(&tx, &key, None));
        assert!(matches!(claim, Ok(TxClaim::Claimed { .. })), "{claim:?}");
        let message = OutboxMessage::new("op-counts", id, b"payload".to_vec()).unwrap();
        let (written, enqueue_cost) = statements(|| outbox.enqueue(&tx, &[message]));
        assert_eq!(written.expect("enqueue"), 1);
        tx.commit().expect("commit");

        let key = Key::new("op-counts", format!("lease-{id}")).unwrap();
        let options = ClaimOptions::lease(std::time::Duration::from_secs(30));
        let Claim::Acquired(lease) = store.claim(&key, &options).await.expect("claim") else {
            panic!("a fresh key was not acquired")
        };
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("begin");
        let (done, commit_cost) = statements(|| store.commit_in_tx(&tx, &lease, Some(b"done")));
        done.expect("commit_in_tx");
        tx.commit().expect("commit");
        if measured {
            assert_cost(BACKEND, "claim_in_tx", cost, CLAIM_IN_TX);
            assert_cost(BACKEND, "outbox enqueue", enqueue_cost, OUTBOX_ENQUEUE);
            assert_cost(BACKEND, "commit_in_tx", commit_cost, COMMIT_IN_TX);
        }
    }
}
