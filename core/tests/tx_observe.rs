//! The transactional inbox's engine (`TxEngine`) emits the lease-mode inbox's metrics, with
//! `mode = "tx"`: counted exactly in a scripted scenario with a `metrics-util` debugging
//! recorder of this thread's own. The backend's transaction is stood for by a fake whose
//! "commit inside the transaction" is a plain commit of the lease.

mod support;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use dedup_core::layers::metric_names as m;
use dedup_core::layers::{ObserveOptions, RetryPolicy};
use dedup_core::{
    DedupStore, Error, FailurePolicy, Handled, HandlerRetry, InboxConfig, InboxError, Key, Lease,
    MemoryStore, RecordState, Transient, TxAttempt, TxAttempts, TxEngine,
};
use futures::future::BoxFuture;

/// What one run of the fake transaction does.
#[derive(Clone, Copy)]
enum Step {
    Commit,
    Fail,
    /// A deadlock or serialization failure: run again under the same lease.
    Conflict,
    /// Another error the database asks to retry (a dropped connection): a new attempt.
    Dropped,
    /// A handler error marked `Transient`.
    Timeout,
}

struct Fake {
    store: Arc<MemoryStore>,
    steps: VecDeque<Step>,
}

impl TxAttempts for Fake {
    fn attempt<'a>(&'a mut self, lease: &'a Lease) -> BoxFuture<'a, TxAttempt> {
        Box::pin(async move {
            match self.steps.pop_front().expect("a planned step") {
                Step::Commit => match self.store.commit(lease, Some(b"done")).await {
                    Ok(()) => TxAttempt::Committed(Some(b"done".to_vec())),
                    Err(e) => TxAttempt::Store(e),
                },
                Step::Fail => TxAttempt::HandlerFailed {
                    source: "declined".into(),
                    retryable: false,
                },
                Step::Timeout => TxAttempt::HandlerFailed {
                    source: Box::new(Transient::new("courier API timed out")),
                    retryable: false,
                },
                Step::Conflict => {
                    let source: dedup_core::BoxError =
                        Error::backend("fake", true, Deadlock).into();
                    let conflict =
                        TxEngine::is_conflict(&*source, |e| e.is::<Deadlock>().then_some(true));
                    assert!(
                        conflict,
                        "the driver's deadlock found behind the store error"
                    );
                    TxAttempt::Conflict(source)
                }
                Step::Dropped => {
                    let source: dedup_core::BoxError =
                        Error::backend("fake", true, "connection reset").into();
                    let retryable = TxEngine::asks_for_retry(&*source, |_| None);
                    assert!(retryable, "a retryable store error asks for a retry");
                    assert!(!TxEngine::is_conflict(&*source, |e| e
                        .is::<Deadlock>()
                        .then_some(true)));
                    TxAttempt::HandlerFailed { source, retryable }
                }
            }
        })
    }
}

/// The fake driver's deadlock error.
#[derive(Debug, thiserror::Error)]
#[error("deadlock detected")]
struct Deadlock;

fn key(id: &str) -> Key {
    Key::new("billing", id).unwrap()
}

#[test]
fn a_tx_inbox_counts_claims_commits_retries_dead_letters_and_stored_failures_with_mode_tx() {
    let ((), snap) = support::recorded(|| async {
        let store = Arc::new(support::tokio_store());
        let shared: Arc<dyn DedupStore> = store.clone();
        let config = InboxConfig {
            renew_every: Some(Duration::from_secs(3600)),
            ..InboxConfig::default()
        };
        let engine = TxEngine::new(shared, config.clone())
            .observed(ObserveOptions::new("memory"))
            .with_retry(RetryPolicy {
                max_retries: 2,
                initial_backoff: Duration::from_millis(1),
                max_backoff: Duration::from_millis(1),
            });
        let run = |id: &'static str, steps: &[Step], engine: TxEngine| {
            let mut fake = Fake {
                store: Arc::clone(&store),
                steps: steps.iter().copied().collect(),
            };
            async move {
                let handled = engine.run(&key(id), None, &mut fake).await;
                assert!(fake.steps.is_empty(), "{id}: every planned step ran");
                handled
            }
        };
        // 3 messages processed, then 2 duplicates.
        for id in ["m1", "m2", "m3"] {
            let handled = run(id, &[Step::Commit], engine.clone()).await;
            assert!(
                matches!(handled, Ok(Handled::Processed { .. })),
                "{handled:?}"
            );
        }
        for id in ["m1", "m2"] {
            let handled = run(id, &[], engine.clone()).await;
            assert!(
                matches!(handled, Ok(Handled::Duplicate { .. })),
                "{handled:?}"
            );
        }
        // A conflict, run again under the same lease (still attempt 1), which commits.
        let handled = run("c", &[Step::Conflict, Step::Commit], engine.clone()).await;
        assert!(
            matches!(&handled, Ok(Handled::Processed { lease, .. }) if lease.attempt == 1),
            "{handled:?}"
        );
        // A dropped connection, retried as a new attempt (2), which commits.
        let handled = run("d", &[Step::Dropped, Step::Commit], engine.clone()).await;
        assert!(
            matches!(&handled, Ok(Handled::Processed { lease, .. }) if lease.attempt == 2),
            "{handled:?}"
        );
        // Conflicts on every run: the 2 retries run out; one attempt used, the failure
        // kept as `conflict`, the lease released, never stored as the result.
        let conflicted = run(
            "x",
            &[Step::Conflict, Step::Conflict, Step::Conflict],
            engine.clone().with_config(InboxConfig {
                failures: FailurePolicy::Store,
                ..config.clone()
            }),
        )
        .await;
        match &conflicted {
            Err(InboxError::Conflict { failure, .. }) => {
                assert_eq!((failure.kind.as_str(), failure.attempt), ("conflict", 1));
            }
            other => panic!("expected InboxError::Conflict, got {other:?}"),
        }
        let record = store.get(&key("x")).await.unwrap().unwrap();
        assert_eq!(
            record.attempt, 1,
            "one attempt used by three runs: {record:?}"
        );
        let kept = record
            .last_failure
            .clone()
            .expect("the conflict kept on the record");
        assert_eq!((kept.kind.as_str(), kept.attempt), ("conflict", 1));
        assert!(
            !matches!(record.state, RecordState::Completed { .. }),
            "released, not stored: {record:?}"
        );
        // A poison message with one attempt: fails, then is dead-lettered, then replayed.
        let poison = engine.clone().with_config(InboxConfig {
            max_attempts: Some(1),
            ..config.clone()
        });
        assert!(run("p", &[Step::Fail], poison.clone()).await.is_err());
        for replay in [false, true] {
            let handled = run("p", &[], poison.clone()).await.unwrap();
            assert!(
                matches!(&handled, Handled::DeadLetter { attempts: 1, replay: r, cause: Some(c) }
                    if *r == replay && c.kind == "handler" && c.attempt == 1),
                "{handled:?}"
            );
        }
        // A stored failure.
        let storing = engine.clone().with_config(InboxConfig {
            failures: FailurePolicy::Store,
            ..config.clone()
        });
        let failed = run("f", &[Step::Fail], storing).await.unwrap();
        assert!(matches!(failed, Handled::Failed { replay: false, .. }));
        // A transient error, run again in process as attempt 2, which commits; then one
        // that stays transient past the retry: given back, never stored as the result,
        // even under FailurePolicy::Store.
        let retrying = engine.clone().with_config(InboxConfig {
            failures: FailurePolicy::Store,
            handler_retry: HandlerRetry::immediate(1),
            ..config.clone()
        });
        let handled = run("t", &[Step::Timeout, Step::Commit], retrying.clone()).await;
        assert!(
            matches!(&handled, Ok(Handled::Processed { lease, .. }) if lease.attempt == 2),
            "{handled:?}"
        );
        let given_back = run("u", &[Step::Timeout, Step::Timeout], retrying).await;
        assert!(
            matches!(given_back, Err(InboxError::Handler { .. })),
            "{given_back:?}"
        );
        let record = store.get(&key("u")).await.unwrap().unwrap();
        assert!(
            !matches!(record.state, RecordState::Completed { .. }),
            "{record:?}"
        );
    });
    let tx = ("mode", "tx");
    // Claims: m1..m3, c, d, x, p, f, t, u acquired; the retries of d, t and u and p's
    // dead-letter run are takeovers (c's and x's conflicts kept their lease); m1, m2 and
    // p's replay are duplicates.
    assert_eq!(
        snap.counter(m::CLAIMS_TOTAL, &[("outcome", "acquired")]),
        10
    );
    assert_eq!(snap.counter(m::CLAIMS_TOTAL, &[("outcome", "takeover")]), 4);
    assert_eq!(
        snap.counter(m::CLAIMS_TOTAL, &[("outcome", "completed")]),
        3
    );
    // Commits: 6 inside a transaction (m1..m3, c, d, t), 2 in lease mode (p's dead letter,
    // f's stored failure).
    assert_eq!(snap.counter(m::COMMITS_TOTAL, &[("backend", "memory")]), 8);
    // Releases: d, t and u before their retries; x, p and u after their last failure.
    assert_eq!(snap.counter(m::RELEASES_TOTAL, &[]), 6);
    assert_eq!(
        snap.observations(m::HANDLER_DURATION_SECONDS, &[tx, ("result", "ok")]),
        6
    );
    assert_eq!(
        snap.observations(m::HANDLER_DURATION_SECONDS, &[tx, ("result", "error")]),
        6
    );
    assert_eq!(
        snap.observations(m::HANDLER_DURATION_SECONDS, &[tx, ("result", "conflict")]),
        4
    );
    assert_eq!(
        snap.counter(m::HANDLER_RETRIES_TOTAL, &[tx, ("reason", "database")]),
        1
    );
    assert_eq!(
        snap.counter(m::HANDLER_RETRIES_TOTAL, &[tx, ("reason", "conflict")]),
        3
    );
    assert_eq!(
        snap.counter(m::HANDLER_RETRIES_TOTAL, &[tx, ("reason", "transient")]),
        2
    );
    assert_eq!(
        snap.counter(m::HANDLER_FAILURES_TOTAL, &[tx, ("kind", "conflict")]),
        1
    );
    assert_eq!(
        snap.observations(m::HANDLER_DURATION_SECONDS, &[("mode", "lease")]),
        0
    );
    assert_eq!(
        snap.counter(m::DEAD_LETTERS_TOTAL, &[tx, ("replay", "false")]),
        1
    );
    assert_eq!(
        snap.counter(m::DEAD_LETTERS_TOTAL, &[tx, ("replay", "true")]),
        1
    );
    assert_eq!(snap.counter(m::STORED_FAILURES_TOTAL, &[tx]), 1);
    assert_eq!(
        snap.counter(m::DEAD_LETTERS_TOTAL, &[tx, ("kind", "handler")]),
        2
    );
    assert!(snap.counter(m::HANDLER_FAILURES_TOTAL, &[tx, ("kind", "handler")]) >= 2);
}

/// `with_store` moves the lease-mode operations to another store and keeps the observation
/// (and the configuration): the claim lands in the new store only, and is counted.
#[test]
fn with_store_sends_the_claims_to_the_new_store_and_keeps_them_observed() {
    let ((), snap) = support::recorded(|| async {
        let (old, new) = (
            Arc::new(support::tokio_store()),
            Arc::new(support::tokio_store()),
        );
        let config = InboxConfig {
            max_attempts: Some(3),
            ..InboxConfig::default()
        };
        let shared: Arc<dyn DedupStore> = old.clone();
        let engine = TxEngine::new(shared, config)
            .observed(ObserveOptions::new("memory"))
            .with_store(new.clone());
        assert_eq!(engine.config().max_attempts, Some(3));
        let mut fake = Fake {
            store: Arc::clone(&new),
            steps: [Step::Commit].into_iter().collect(),
        };
        let handled = engine.run(&key("m1"), None, &mut fake).await;
        assert!(
            matches!(handled, Ok(Handled::Processed { .. })),
            "{handled:?}"
        );
        assert!(old.get(&key("m1")).await.unwrap().is_none());
        let record = new.get(&key("m1")).await.unwrap().unwrap();
        assert!(
            matches!(record.state, RecordState::Completed { .. }),
            "{record:?}"
        );
    });
    assert_eq!(
        snap.counter(
            m::CLAIMS_TOTAL,
            &[("backend", "memory"), ("outcome", "acquired")]
        ),
        1
    );
}
