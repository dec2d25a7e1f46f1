//! The transactional inbox engine's (`TxEngine`) small rules: its settings, the reserved
//! outcome bytes, and how it reads an error's source chain.

mod support;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use dedup_core::layers::metric_names as m;
use dedup_core::layers::{ObserveOptions, RetryPolicy};
use dedup_core::{
    DedupStore, Error, Handled, InboxConfig, InboxError, Key, Lease, MemoryStore, TxAttempt,
    TxAttempts, TxEngine,
};
use futures::future::BoxFuture;

fn engine() -> TxEngine {
    let store: Arc<dyn DedupStore> = Arc::new(MemoryStore::new());
    TxEngine::new(store, InboxConfig::default())
}

/// A driver's error the fake driver below classifies.
#[derive(Debug, thiserror::Error)]
#[error("driver said {0}")]
struct Driver(bool);

fn driver(e: &(dyn std::error::Error + 'static)) -> Option<bool> {
    e.downcast_ref::<Driver>().map(|d| d.0)
}

/// One run of the scripted transaction.
enum Run {
    /// Complete the key (a plain commit of the lease stands for `commit_in_tx`).
    Commit,
    /// End with this answer, as a backend does after its rollback.
    Answer(TxAttempt),
}

/// A backend's transactions, each run answering the next planned [`Run`].
struct Script {
    store: Arc<MemoryStore>,
    runs: VecDeque<Run>,
    /// When each run began (tokio's clock).
    began: Vec<tokio::time::Instant>,
}

impl TxAttempts for Script {
    fn attempt<'a>(&'a mut self, lease: &'a Lease) -> BoxFuture<'a, TxAttempt> {
        Box::pin(async move {
            self.began.push(tokio::time::Instant::now());
            match self.runs.pop_front().expect("a planned run") {
                Run::Commit => match self.store.commit(lease, None).await {
                    Ok(()) => TxAttempt::Committed(None),
                    Err(e) => TxAttempt::Store(e),
                },
                Run::Answer(answer) => answer,
            }
        })
    }
}

/// An engine over a fresh store, retrying what the database asks for once, at once.
fn scripted(runs: Vec<Run>) -> (TxEngine, Script, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    let shared: Arc<dyn DedupStore> = store.clone();
    let engine = TxEngine::new(shared, InboxConfig::default()).with_retry(RetryPolicy {
        max_retries: 1,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
    });
    let script = Script {
        store: Arc::clone(&store),
        runs: runs.into(),
        began: Vec::new(),
    };
    (engine, script, store)
}

fn key() -> Key {
    Key::new("billing", "order-1").unwrap()
}

#[tokio::test]
async fn a_lease_lost_at_the_commit_is_given_back_as_lease_lost_and_not_released() {
    let lost = Error::lease_lost(&key());
    let (engine, mut script, store) = scripted(vec![Run::Answer(TxAttempt::Store(lost))]);
    let handled = engine.run(&key(), None, &mut script).await;
    assert!(
        matches!(&handled, Err(InboxError::LeaseLost { key: k }) if *k == key()),
        "{handled:?}"
    );
    let record = store.get(&key()).await.unwrap().unwrap();
    assert_eq!(record.last_failure, None, "the new owner's key: no release");
}

#[tokio::test]
async fn a_store_error_at_the_commit_releases_the_key_with_its_failure() {
    let down = Error::backend("fake", false, "disk full");
    let (engine, mut script, store) = scripted(vec![Run::Answer(TxAttempt::Store(down))]);
    let handled = engine.run(&key(), None, &mut script).await;
    assert!(
        matches!(&handled, Err(InboxError::Store(e)) if !e.is_lease_lost()),
        "{handled:?}"
    );
    let record = store.get(&key()).await.unwrap().unwrap();
    let failure = record
        .last_failure
        .expect("the failure kept by the release");
    assert_eq!((failure.kind.as_str(), failure.attempt), ("store", 1));
}

#[tokio::test]
async fn runs_the_database_asks_for_stop_at_the_policys_limit() {
    let dropped = || {
        Run::Answer(TxAttempt::HandlerFailed {
            source: "connection reset".into(),
            retryable: true,
        })
    };
    let (engine, mut script, store) = scripted(vec![dropped(), dropped(), Run::Commit]);
    let handled = engine.run(&key(), None, &mut script).await;
    assert!(
        matches!(&handled, Err(InboxError::Handler { .. })),
        "one run again allowed, not two: {handled:?}"
    );
    assert_eq!(script.runs.len(), 1, "the commit never ran");
    let record = store.get(&key()).await.unwrap().unwrap();
    assert_eq!(record.attempt, 2, "the run again was a new attempt");
}

#[test]
fn the_retry_policy_is_the_one_given() {
    let policy = RetryPolicy {
        max_retries: 7,
        initial_backoff: Duration::from_millis(3),
        max_backoff: Duration::from_millis(30),
    };
    assert_ne!(*engine().retry(), policy);
    assert_eq!(*engine().with_retry(policy).retry(), policy);
}

#[test]
fn its_debug_output_names_the_engine_and_its_settings() {
    let shown = format!("{:?}", engine().with_retry(RetryPolicy::NEVER));
    assert!(shown.starts_with("TxEngine {"), "{shown}");
    for field in ["config", "retry", "max_retries: 0", "observe"] {
        assert!(shown.contains(field), "{field} in {shown}");
    }
}

#[test]
fn an_outcome_with_the_reserved_bytes_is_refused() {
    let refused = TxEngine::check_outcome(Some(b"\0dedup:failed")).unwrap_err();
    assert!(refused.to_string().contains("reserved bytes"), "{refused}");
    TxEngine::check_outcome(Some(b"receipt-1")).unwrap();
    TxEngine::check_outcome(None).unwrap();
}

#[test]
fn only_an_error_the_database_asks_to_retry_runs_again() {
    let plain: dedup_core::BoxError = "card declined".into();
    assert!(
        !TxEngine::asks_for_retry(&*plain, driver),
        "no retryable error in the chain"
    );
    let fatal = Error::backend("fake", false, Driver(true));
    assert!(
        !TxEngine::asks_for_retry(&fatal, driver),
        "the first dedup error in the chain decides, not its source"
    );
    let retryable = Error::backend("fake", true, "connection reset");
    assert!(TxEngine::asks_for_retry(&retryable, driver));
    let refused: dedup_core::BoxError = Box::new(Driver(false));
    assert!(
        !TxEngine::asks_for_retry(&*refused, driver),
        "the driver says no"
    );
    let asked: dedup_core::BoxError = Box::new(Driver(true));
    assert!(
        TxEngine::asks_for_retry(&*asked, driver),
        "the driver says yes"
    );
}

#[tokio::test]
async fn a_store_error_the_database_asks_to_retry_runs_again_as_a_new_attempt() {
    let reset = || Run::Answer(TxAttempt::Store(Error::backend("fake", true, "reset")));
    let (engine, mut script, _store) = scripted(vec![reset(), Run::Commit]);
    let handled = engine.run(&key(), None, &mut script).await;
    assert!(
        matches!(&handled, Ok(Handled::Processed { lease, .. }) if lease.attempt == 2),
        "{handled:?}"
    );
    // Used up: one run again allowed, not two.
    let (engine, mut script, store) = scripted(vec![reset(), reset(), Run::Commit]);
    let handled = engine.run(&key(), None, &mut script).await;
    assert!(
        matches!(&handled, Err(InboxError::Store(e)) if e.is_retryable()),
        "{handled:?}"
    );
    assert_eq!(script.runs.len(), 1, "the commit never ran");
    let record = store.get(&key()).await.unwrap().unwrap();
    let failure = record
        .last_failure
        .expect("the failure kept by the release");
    assert_eq!((failure.kind.as_str(), failure.attempt), ("store", 2));
}

#[tokio::test(start_paused = true)]
async fn the_delay_before_each_run_the_database_asks_for_doubles() {
    let dropped = || {
        Run::Answer(TxAttempt::HandlerFailed {
            source: "connection reset".into(),
            retryable: true,
        })
    };
    let (engine, mut script, _store) = scripted(vec![dropped(), dropped(), dropped(), Run::Commit]);
    let engine = engine.with_retry(RetryPolicy {
        max_retries: 3,
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(300),
    });
    let handled = engine.run(&key(), None, &mut script).await;
    assert!(
        matches!(handled, Ok(Handled::Processed { .. })),
        "{handled:?}"
    );
    let gaps: Vec<u128> = (script.began.windows(2))
        .map(|w| (w[1] - w[0]).as_millis())
        .collect();
    assert_eq!(
        gaps,
        [100, 200, 300],
        "doubling, at most the policy's largest"
    );
}

#[tokio::test(start_paused = true)]
async fn a_conflict_runs_again_after_the_policys_backoff() {
    let deadlock = || Run::Answer(TxAttempt::Conflict("deadlock detected".into()));
    let (engine, mut script, _store) = scripted(vec![deadlock(), Run::Commit]);
    let engine = engine.with_retry(RetryPolicy {
        max_retries: 1,
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(100),
    });
    let handled = engine.run(&key(), None, &mut script).await;
    assert!(
        matches!(&handled, Ok(Handled::Processed { lease, .. }) if lease.attempt == 1),
        "{handled:?}"
    );
    let waited = script.began[1] - script.began[0];
    assert!(
        waited >= Duration::from_millis(50) && waited <= Duration::from_millis(100),
        "between half the backoff and all of it: {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn is_conflict_and_is_lease_lost_each_name_their_own_error() {
    let deadlock = || Run::Answer(TxAttempt::Conflict("deadlock detected".into()));
    let (engine, mut script, _store) = scripted(vec![deadlock(), deadlock()]);
    let conflict = engine.run(&key(), None, &mut script).await.unwrap_err();
    assert!(
        matches!(conflict, InboxError::Conflict { .. }),
        "{conflict:?}"
    );
    assert!(conflict.is_conflict(), "{conflict:?}");
    assert!(!conflict.is_lease_lost(), "{conflict:?}");

    let lost = Run::Answer(TxAttempt::Store(Error::lease_lost(&key())));
    let (engine, mut script, _store) = scripted(vec![lost]);
    let lost = engine.run(&key(), None, &mut script).await.unwrap_err();
    assert!(lost.is_lease_lost(), "{lost:?}");
    assert!(!lost.is_conflict(), "{lost:?}");
}

#[test]
fn a_lease_lost_at_the_commit_is_counted_as_a_lost_commit_in_the_transaction() {
    let ((), snap) = support::recorded(|| async {
        let lost = Error::lease_lost(&key());
        let (engine, mut script, _store) = scripted(vec![Run::Answer(TxAttempt::Store(lost))]);
        let engine = engine.observed(ObserveOptions::new("memory"));
        let handled = engine.run(&key(), None, &mut script).await;
        assert!(
            matches!(handled, Err(InboxError::LeaseLost { .. })),
            "{handled:?}"
        );
    });
    let labels = [("backend", "memory"), ("op", "commit_in_tx")];
    assert_eq!(snap.counter(m::LEASE_LOST_TOTAL, &labels), 1);
}
