//! Poison messages and failure policy: the attempt limit, dead letters, stored failures.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dedup_core::{
    ClaimOptions, DedupStore, FailurePolicy, Handled, Inbox, InboxConfig, InboxError, Key,
    MemoryStore, RecordState,
};

fn key() -> Key {
    Key::new("billing", "poison-1").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_attempts_are_never_exceeded_by_concurrent_workers() {
    // 12 workers on 4 threads keep redelivering one message whose handler always fails.
    // Every acquisition is a new attempt, so at most 3 handler runs may ever happen, and then
    // every worker is told to dead-letter; exactly one of them dead-lettered it first.
    const MAX: u32 = 3;
    let inbox = Inbox::new(MemoryStore::new()).with_config(InboxConfig {
        lease: Duration::from_secs(5),
        max_attempts: Some(MAX),
        ..InboxConfig::default()
    });
    let runs = Arc::new(AtomicU32::new(0));
    let workers = (0..12).map(|_| {
        let (inbox, runs) = (inbox.clone(), Arc::clone(&runs));
        tokio::spawn(async move {
            for _ in 0..10_000 {
                let handled = inbox
                    .handle(&key(), None, |_| async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        Err::<Option<Vec<u8>>, _>("malformed payload")
                    })
                    .await;
                match handled {
                    Ok(Handled::DeadLetter {
                        attempts, replay, ..
                    }) => return (attempts, replay),
                    Ok(Handled::Busy { .. }) | Err(InboxError::Handler { .. }) => {
                        tokio::task::yield_now().await
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
            panic!("never told to dead-letter")
        })
    });
    let results: Vec<(u32, bool)> = futures::future::try_join_all(workers).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), MAX, "handler runs");
    assert!(results.iter().all(|(attempts, _)| *attempts == MAX));
    assert_eq!(results.iter().filter(|(_, replay)| !replay).count(), 1);
    let record = inbox.store().get(&key()).await.unwrap().unwrap();
    assert_eq!(record.attempt, MAX + 1);
    assert!(matches!(record.state, RecordState::Completed { .. }));
}

#[tokio::test(start_paused = true)]
async fn a_crashed_attempt_counts_towards_the_limit() {
    // Attempt 1 dies with its worker (its lease just expires); attempt 2 fails; attempt 3
    // is past the limit of 2 and does not run the handler.
    let inbox = Inbox::new(support::tokio_store()).with_config(InboxConfig {
        lease: Duration::from_secs(10),
        max_attempts: Some(2),
        ..InboxConfig::default()
    });
    let crashed = inbox
        .store()
        .claim(&key(), &ClaimOptions::lease(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(crashed.is_acquired());
    tokio::time::sleep(Duration::from_secs(11)).await;
    let runs = AtomicU32::new(0);
    let fail = |_| async {
        runs.fetch_add(1, Ordering::SeqCst);
        Err::<Option<Vec<u8>>, _>("boom")
    };
    assert!(matches!(
        inbox.handle(&key(), None, fail).await,
        Err(InboxError::Handler { .. })
    ));
    let first = inbox.handle(&key(), None, fail).await.unwrap();
    assert!(
        matches!(&first, Handled::DeadLetter { attempts: 2, replay: false, cause: Some(c) }
            if c.kind == "handler" && c.chain == ["boom"] && c.attempt == 2),
        "{first:?}"
    );
    let again = inbox.handle(&key(), None, fail).await.unwrap();
    assert!(
        matches!(&again, Handled::DeadLetter { attempts: 2, replay: true, cause: Some(c) }
            if c.chain == ["boom"]),
        "{again:?}"
    );
    assert!(again.is_replay() && again.is_settled());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_stored_failure_is_replayed_to_duplicates_without_running_the_handler() {
    let inbox = Inbox::new(support::tokio_store()).with_config(InboxConfig {
        failures: FailurePolicy::Store,
        ..InboxConfig::default()
    });
    let runs = AtomicU32::new(0);
    let declined = |_| async {
        runs.fetch_add(1, Ordering::SeqCst);
        let cause = std::io::Error::other("insufficient funds");
        Err::<Option<Vec<u8>>, _>(anyhow::Error::new(cause).context("card declined"))
    };
    let first = inbox.handle(&key(), None, declined).await.unwrap();
    let error = "card declined: insufficient funds".to_owned();
    assert_eq!(
        first,
        Handled::Failed {
            error: error.clone(),
            replay: false
        }
    );
    assert!(!first.is_replay());
    let second = inbox.handle(&key(), None, declined).await.unwrap();
    assert_eq!(
        second,
        Handled::Failed {
            error,
            replay: true
        }
    );
    assert!(second.is_replay());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // With the default policy the same failure is released for a retry instead.
    let retrying = inbox.clone().with_config(InboxConfig::default());
    let other = Key::new("billing", "poison-2").unwrap();
    assert!(retrying.handle(&other, None, declined).await.is_err());
    assert!(retrying.handle(&other, None, declined).await.is_err());
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[test]
fn a_dead_letter_after_crashed_attempts_says_no_error_was_kept() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = std::sync::Arc::new(dedup_core::MemoryStore::new());
        let inbox = dedup_core::Inbox::from_arc(
            std::sync::Arc::clone(&store),
            dedup_core::InboxConfig {
                max_attempts: Some(1),
                ..dedup_core::InboxConfig::default()
            },
        );
        let key = dedup_core::Key::new("orders", "crashy").unwrap();
        // Attempt 1 crashes: its lease is released without a cause.
        let lease = store
            .claim(&key, &dedup_core::ClaimOptions::default())
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        store.release(&lease).await.unwrap();
        let handled = inbox
            .handle(&key, None, |_| async { Ok::<_, &str>(None) })
            .await
            .unwrap();
        assert!(
            matches!(&handled, Handled::DeadLetter { attempts: 1, cause: Some(c), .. }
                if c.kind == "attempts" && c.message().contains("no attempt left")),
            "{handled:?}"
        );
    });
}
