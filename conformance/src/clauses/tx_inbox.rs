//! The transactional inbox (`TxInbox` of the SQL backends): the handler's business rows and
//! the key's completion commit together; attempts are counted in lease mode, so they
//! survive rollbacks and killed workers; the same [`Handled`] answers as the lease-mode
//! `Inbox`.
//!
//! The handler writes the business row `row@<attempt>` in the inbox's transaction (see
//! [`TxWork`]), so the business rows show which attempt committed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dedup_core::layers::RetryPolicy;
use dedup_core::{FailurePolicy, Handled, InboxConfig, InboxError, Key, RecordState};

use crate::support::{LEASE, acquire, key, record, setup};
use crate::{TxInboxFactory, TxJob, TxWork};

/// The configuration the clauses use: no renewal during a clause (leases expire only by
/// the clause's clock), the attempt limit and failure policy given.
fn config(max_attempts: Option<u32>, failures: FailurePolicy) -> InboxConfig {
    InboxConfig {
        renew_every: Some(Duration::from_secs(3600)),
        max_attempts,
        failures,
        ..InboxConfig::default()
    }
}

/// A fast retry policy: `retries` retries, 1 ms apart.
fn retries(retries: u32) -> RetryPolicy {
    RetryPolicy {
        max_retries: retries,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
    }
}

/// One delivery of `k` doing `work`; returns the answer and the handler's runs.
async fn handle<F: TxInboxFactory>(
    factory: &F,
    store: &F::Store,
    k: &Key,
    config: InboxConfig,
    retry: RetryPolicy,
    work: TxWork,
) -> (Result<Handled, InboxError>, u32) {
    let runs = Arc::new(AtomicU32::new(0));
    let job = TxJob {
        config,
        retry,
        work,
        runs: Arc::clone(&runs),
    };
    let handled = factory.tx_handle(store, k, None, job).await;
    (handled, runs.load(Ordering::SeqCst))
}

fn succeed(outcome: &[u8]) -> TxWork {
    TxWork::Succeed(Some(outcome.to_vec()))
}

fn fail(message: &str) -> TxWork {
    TxWork::Fail(message.to_owned())
}

fn rows(labels: &[&str]) -> Vec<String> {
    labels.iter().map(|l| (*l).to_owned()).collect()
}

/// The attempt a `Processed` answer ran as; panics on any other answer.
fn processed_attempt(handled: &Result<Handled, InboxError>, what: &str) -> u32 {
    match handled {
        Ok(Handled::Processed { lease, .. }) => lease.attempt,
        other => panic!("{what}: expected Processed, got {other:?}"),
    }
}

/// Whether the key's record is completed.
async fn is_completed<S: dedup_core::DedupStore>(store: &S, k: &Key) -> bool {
    matches!(
        record(store, k).await,
        Some(r) if matches!(r.state, RecordState::Completed { .. })
    )
}

/// A first delivery runs the handler once and commits its business row with the key's
/// completion (`Processed`, attempt 1, the outcome); a second delivery does not run the
/// handler and gets `Duplicate` with the stored outcome, byte for byte.
pub async fn tx_inbox_runs_a_key_once_and_a_duplicate_gets_the_stored_outcome<F: TxInboxFactory>(
    factory: &F,
) {
    let (_ctx, store) = setup(
        factory,
        "tx_inbox_runs_a_key_once_and_a_duplicate_gets_the_stored_outcome",
    )
    .await;
    let k = key("m1");
    let cfg = config(None, FailurePolicy::Retry);
    let (first, runs) = handle(factory, &store, &k, cfg.clone(), retries(0), succeed(b"o")).await;
    assert_eq!(processed_attempt(&first, "first delivery"), 1);
    assert!(
        matches!(&first, Ok(Handled::Processed { outcome: Some(o), .. }) if o == b"o"),
        "first delivery: {first:?}"
    );
    assert_eq!(runs, 1, "the handler runs once");
    assert!(is_completed(&store, &k).await, "the key is completed");
    let (again, runs) = handle(factory, &store, &k, cfg, retries(0), succeed(b"x")).await;
    assert_eq!(runs, 0, "a duplicate must not run the handler");
    assert!(
        matches!(&again, Ok(Handled::Duplicate { outcome: Some(o), .. }) if o == b"o"),
        "a duplicate gets the stored outcome: {again:?}"
    );
    assert_eq!(factory.business_rows(&store, &k).await, rows(&["row@1"]));
}

/// A handler failure rolls back: no business row, the key not completed, the handler's
/// error returned (`InboxError::Handler`); the next delivery runs again as attempt 2 and
/// commits only its own row.
pub async fn tx_inbox_rollback_leaves_no_business_row_and_no_completion<F: TxInboxFactory>(
    factory: &F,
) {
    let (_ctx, store) = setup(
        factory,
        "tx_inbox_rollback_leaves_no_business_row_and_no_completion",
    )
    .await;
    let k = key("m1");
    let cfg = config(None, FailurePolicy::Retry);
    let (failed, runs) = handle(factory, &store, &k, cfg.clone(), retries(3), fail("boom")).await;
    assert_eq!(runs, 1, "a plain handler error is not retried");
    match &failed {
        Err(InboxError::Handler { source, .. }) => {
            assert!(source.to_string().contains("boom"), "{source}")
        }
        other => panic!("a failing handler: expected InboxError::Handler, got {other:?}"),
    }
    assert_eq!(
        factory.business_rows(&store, &k).await,
        rows(&[]),
        "a rolled-back run leaves no business row"
    );
    assert!(
        !is_completed(&store, &k).await,
        "a rollback must not complete the key"
    );
    let (next, _) = handle(factory, &store, &k, cfg, retries(0), succeed(b"o")).await;
    assert_eq!(processed_attempt(&next, "the next delivery"), 2);
    assert_eq!(factory.business_rows(&store, &k).await, rows(&["row@2"]));
}

/// Attempts count across everything that ends a run without a commit: a rollback
/// (attempt 1), a worker that crashed after claiming (its lease expires; attempt 2), a
/// worker killed mid-handler (its future dropped; attempt 3): the delivery that finally
/// commits is attempt 4, and only its business row exists.
pub async fn tx_inbox_attempts_count_across_rollbacks_and_killed_workers<F: TxInboxFactory>(
    factory: &F,
) {
    let (ctx, store) = setup(
        factory,
        "tx_inbox_attempts_count_across_rollbacks_and_killed_workers",
    )
    .await;
    let k = key("m1");
    let cfg = config(None, FailurePolicy::Retry);
    let (failed, _) = handle(factory, &store, &k, cfg.clone(), retries(0), fail("boom")).await;
    assert!(failed.is_err(), "attempt 1 fails: {failed:?}");

    // A worker claims (attempt 2) and crashes: its lease runs out.
    let crashed = acquire(&store, &k).await;
    assert_eq!(
        crashed.attempt, 2,
        "the claim after a rollback is attempt 2"
    );
    ctx.clock.advance(LEASE);

    // A worker is killed mid-handler (attempt 3): its future is dropped.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (proceed_tx, proceed_rx) = tokio::sync::oneshot::channel::<()>();
    let work = TxWork::Hang {
        started: started_tx,
        proceed: proceed_rx,
    };
    let killed = handle(factory, &store, &k, cfg.clone(), retries(0), work);
    tokio::select! {
        answer = killed => panic!("the hanging handler answered {answer:?}"),
        started = started_rx => started.expect("the killed worker's handler started"),
    }
    drop(proceed_tx);

    // The next delivery: the killed worker's lease is released in the background (Busy
    // until then), and the run after it is attempt 4.
    let mut answer = None;
    for _ in 0..200 {
        let (handled, _) =
            handle(factory, &store, &k, cfg.clone(), retries(0), succeed(b"o")).await;
        if !matches!(handled, Ok(Handled::Busy { .. })) {
            answer = Some(handled);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer = answer.expect("the killed worker's lease was never given up");
    assert_eq!(processed_attempt(&answer, "after a kill"), 4);
    assert_eq!(
        factory.business_rows(&store, &k).await,
        rows(&["row@4"]),
        "only the committed attempt's business row"
    );
}

/// With `max_attempts = 2`, two failed runs use up the key: the third delivery does not run
/// the handler and gets `DeadLetter { attempts: 2, replay: false }` with the second run's
/// error as its cause, later ones `replay: true`; each failed run's cause is readable on
/// the record with `get` right after it; no business row is ever committed.
pub async fn tx_inbox_dead_letters_a_key_past_max_attempts<F: TxInboxFactory>(factory: &F) {
    let (_ctx, store) = setup(factory, "tx_inbox_dead_letters_a_key_past_max_attempts").await;
    let k = key("poison");
    let cfg = config(Some(2), FailurePolicy::Retry);
    for attempt in 1..=2 {
        let (failed, runs) = handle(
            factory,
            &store,
            &k,
            cfg.clone(),
            retries(0),
            fail("malformed"),
        )
        .await;
        assert!(failed.is_err(), "attempt {attempt}: {failed:?}");
        assert_eq!(runs, 1, "attempt {attempt} runs the handler");
        let kept = dedup_core::DedupStore::get(&store, &k)
            .await
            .expect("get")
            .and_then(|r| r.last_failure);
        assert!(
            kept.as_ref()
                .is_some_and(|c| c.attempt == attempt && c.message().contains("malformed")),
            "attempt {attempt}'s cause must be kept on the record, got {kept:?}"
        );
    }
    for replay in [false, true] {
        let (handled, runs) =
            handle(factory, &store, &k, cfg.clone(), retries(0), succeed(b"o")).await;
        assert_eq!(runs, 0, "a dead-lettered key must not run the handler");
        let handled = handled.expect("dead letter");
        assert!(
            matches!(&handled, Handled::DeadLetter { attempts: 2, replay: r, cause: Some(c) }
                if *r == replay && c.kind == "handler" && c.attempt == 2
                    && c.chain.iter().any(|l| l.contains("malformed"))),
            "a dead letter with its last cause (attempt 2, malformed), got {handled:?}"
        );
    }
    assert_eq!(factory.business_rows(&store, &k).await, rows(&[]));
}

/// A run that meets a real conflict the database refuses the transaction for (a
/// serialization failure, a lock refused, SQLite busy) is rolled back and run again in a
/// fresh transaction under the same lease, without using an attempt: `Processed` as
/// attempt 1, two runs, one business row (`row@1`), and the key completed once. Without
/// retries the conflict ends the delivery as a failed attempt: `InboxError::Conflict`,
/// the failure kept on the record as kind `conflict` (never stored as the key's result,
/// even under `FailurePolicy::Store`), and the next delivery runs as attempt 2.
pub async fn tx_inbox_retries_a_transaction_the_database_refused_and_commits_once<
    F: TxInboxFactory,
>(
    factory: &F,
) {
    let (_ctx, store) = setup(
        factory,
        "tx_inbox_retries_a_transaction_the_database_refused_and_commits_once",
    )
    .await;
    let cfg = config(None, FailurePolicy::Store);
    let never = key("never-retried");
    let (refused, runs) = handle(
        factory,
        &store,
        &never,
        cfg.clone(),
        RetryPolicy::NEVER,
        TxWork::ConflictOnce(None),
    )
    .await;
    assert_eq!(runs, 1);
    match &refused {
        Err(InboxError::Conflict { failure, .. }) => {
            assert_eq!((failure.kind.as_str(), failure.attempt), ("conflict", 1));
        }
        other => panic!(
            "without retries the conflict ends the delivery as InboxError::Conflict (not \
             stored as a failure), got {other:?}"
        ),
    }
    assert_eq!(factory.business_rows(&store, &never).await, rows(&[]));
    let kept = record(&store, &never).await.expect("a record");
    assert_eq!(kept.attempt, 1, "{kept:?}");
    assert!(
        kept.last_failure
            .as_ref()
            .is_some_and(|f| f.kind == "conflict"),
        "the conflict kept on the record: {kept:?}"
    );
    let (again, _) = handle(
        factory,
        &store,
        &never,
        cfg.clone(),
        RetryPolicy::NEVER,
        succeed(b"n"),
    )
    .await;
    assert_eq!(processed_attempt(&again, "the next delivery"), 2);

    let k = key("m1");
    let work = TxWork::ConflictOnce(Some(b"o".to_vec()));
    let (handled, runs) = handle(factory, &store, &k, cfg.clone(), retries(3), work).await;
    assert_eq!(
        processed_attempt(&handled, "after a conflict"),
        1,
        "a conflict's run again uses no attempt"
    );
    assert_eq!(runs, 2, "one refused run, one committed");
    assert_eq!(factory.business_rows(&store, &k).await, rows(&["row@1"]));
    let (again, runs) = handle(factory, &store, &k, cfg, retries(3), succeed(b"x")).await;
    assert_eq!(runs, 0);
    assert!(
        matches!(&again, Ok(Handled::Duplicate { outcome: Some(o), .. }) if o == b"o"),
        "{again:?}"
    );
}

/// With `FailurePolicy::Store`, a handler failure is rolled back (no business row) and
/// stored as the key's result: `Failed { replay: false }` with the error's text, then
/// `Failed { replay: true }` with the same text for every later delivery, which does not
/// run the handler.
pub async fn tx_inbox_stores_a_failure_and_replays_it<F: TxInboxFactory>(factory: &F) {
    let (_ctx, store) = setup(factory, "tx_inbox_stores_a_failure_and_replays_it").await;
    let k = key("declined");
    let cfg = config(None, FailurePolicy::Store);
    let (failed, runs) = handle(
        factory,
        &store,
        &k,
        cfg.clone(),
        retries(3),
        fail("card declined"),
    )
    .await;
    assert_eq!(runs, 1);
    let error = match failed {
        Ok(Handled::Failed {
            error,
            replay: false,
        }) => error,
        other => panic!("a stored failure: expected Failed, got {other:?}"),
    };
    assert!(error.contains("card declined"), "{error}");
    assert_eq!(factory.business_rows(&store, &k).await, rows(&[]));
    let (again, runs) = handle(factory, &store, &k, cfg, retries(3), succeed(b"o")).await;
    assert_eq!(runs, 0, "a stored failure must not run the handler again");
    assert_eq!(
        again.expect("replayed failure"),
        Handled::Failed {
            error,
            replay: true
        }
    );
}
