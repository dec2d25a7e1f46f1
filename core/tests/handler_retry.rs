//! The in-process handler retry of the lease-mode `Inbox` (`InboxConfig::handler_retry`):
//! only `Transient` errors run again, each run is a new attempt, the delay holds the lease,
//! `max_attempts` still caps the runs, a transient error is never stored as the result. On
//! MemoryStore with tokio's paused clock, so delays take no real time.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dedup_core::layers::metric_names as m;
use dedup_core::{
    DedupStore, DuplicateLog, FailurePolicy, Handled, HandlerRetry, Inbox, InboxConfig, InboxError,
    Key, MemoryStore, RecordState, Transient,
};

fn inbox(config: InboxConfig) -> Inbox<MemoryStore> {
    Inbox::new(support::tokio_store()).with_config(config)
}

fn key() -> Key {
    Key::new("couriers", "parcel-9").unwrap()
}

fn timeout() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "courier API timed out")
}

#[tokio::test(start_paused = true)]
async fn a_transient_error_runs_again_as_a_new_attempt_after_the_delay() {
    let inbox = inbox(InboxConfig {
        handler_retry: HandlerRetry::interval(3, Duration::from_secs(2)),
        ..InboxConfig::default()
    });
    let runs = AtomicU32::new(0);
    let started = tokio::time::Instant::now();
    let handled = inbox
        .handle(&key(), None, |lease| {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                // Each run is a new attempt and a new owner for fencing.
                assert_eq!((lease.attempt, lease.fence), (run, u64::from(run)));
                if run < 3 {
                    Err(Transient::new(timeout()))
                } else {
                    Ok(Some(b"booked".to_vec()))
                }
            }
        })
        .await
        .unwrap();
    assert!(
        matches!(&handled, Handled::Processed { lease, .. } if lease.attempt == 3),
        "{handled:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "two 2 s delays"
    );
}

#[tokio::test(start_paused = true)]
async fn an_error_not_marked_transient_is_given_back_at_once() {
    let inbox = inbox(InboxConfig {
        handler_retry: HandlerRetry::immediate(5),
        ..InboxConfig::default()
    });
    let runs = AtomicU32::new(0);
    let err = inbox
        .handle(&key(), None, |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Err::<Option<Vec<u8>>, _>(timeout()) }
        })
        .await
        .unwrap_err();
    assert!(matches!(err, InboxError::Handler { .. }), "{err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn retries_used_up_give_the_error_back_and_never_store_it() {
    let inbox = inbox(InboxConfig {
        handler_retry: HandlerRetry::immediate(2),
        failures: FailurePolicy::Store,
        ..InboxConfig::default()
    });
    let runs = AtomicU32::new(0);
    let err = inbox
        .handle(&key(), None, |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Err::<Option<Vec<u8>>, _>(Transient::new(timeout())) }
        })
        .await
        .unwrap_err();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "the first run and 2 retries"
    );
    let io = err
        .handler_error::<std::io::Error>()
        .expect("seen through Transient");
    assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
    let record = inbox.store().get(&key()).await.unwrap().unwrap();
    assert!(
        !matches!(record.state, RecordState::Completed { .. }),
        "released, not completed: {record:?}"
    );
    assert_eq!(record.attempt, 3);
}

#[tokio::test(start_paused = true)]
async fn a_handler_owning_its_input_runs_again_with_a_clone_per_run() {
    let inbox = inbox(InboxConfig {
        handler_retry: HandlerRetry::immediate(5),
        ..InboxConfig::default()
    });
    let request = String::from("parcel for Ada");
    let runs = AtomicU32::new(0);
    let handled = inbox
        .handle(&key(), None, move |_| {
            let request = request.clone();
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                if run == 1 {
                    Err(Transient::new(timeout()))
                } else {
                    Ok(Some(request.into_bytes()))
                }
            }
        })
        .await
        .unwrap();
    assert!(
        matches!(&handled, Handled::Processed { outcome: Some(o), lease } if o == b"parcel for Ada" && lease.attempt == 2),
        "{handled:?}"
    );
}

#[cfg(feature = "serde")]
#[tokio::test(start_paused = true)]
async fn handle_json_runs_again_too() {
    let inbox = inbox(InboxConfig {
        handler_retry: HandlerRetry::immediate(1),
        ..InboxConfig::default()
    });
    let runs = AtomicU32::new(0);
    let handled = inbox
        .handle_json(&key(), None, |_| {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                if run == 1 {
                    Err(Transient::new(timeout()))
                } else {
                    Ok(run)
                }
            }
        })
        .await
        .unwrap();
    assert!(
        matches!(handled, Handled::Processed { outcome: 2, .. }),
        "{handled:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn max_attempts_caps_the_runs_and_dead_letters() {
    let inbox = inbox(InboxConfig {
        handler_retry: HandlerRetry::immediate(10),
        max_attempts: Some(2),
        ..InboxConfig::default()
    });
    let runs = AtomicU32::new(0);
    let handled = inbox
        .handle(&key(), None, |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Err::<Option<Vec<u8>>, _>(Transient::new(timeout())) }
        })
        .await
        .unwrap();
    match handled {
        Handled::DeadLetter {
            attempts: 2,
            replay: false,
            cause: Some(cause),
        } => {
            assert_eq!(cause.kind, "transient", "{cause}");
            assert_eq!(cause.attempt, 2, "{cause}");
        }
        other => panic!("expected a dead letter with its cause, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_during_the_delay_is_busy() {
    let inbox = inbox(InboxConfig {
        lease: Duration::from_secs(3),
        handler_retry: HandlerRetry::interval(1, Duration::from_secs(10)),
        ..InboxConfig::default()
    });
    let runs = AtomicU32::new(0);
    let key = key();
    let first = inbox.handle(&key, None, |lease| {
        let run = runs.fetch_add(1, Ordering::SeqCst);
        async move {
            if lease.attempt == 1 {
                Err(Transient::new(timeout()))
            } else {
                Ok::<_, Transient>(Some(vec![run as u8]))
            }
        }
    });
    let duplicate = async {
        // Well past the 3 s lease: the delay renews it.
        tokio::time::sleep(Duration::from_secs(7)).await;
        inbox
            .handle(&key, None, |_| async { Ok::<_, &str>(None) })
            .await
    };
    let (first, duplicate) = tokio::join!(first, duplicate);
    assert!(
        matches!(duplicate, Ok(Handled::Busy { attempt: 1, .. })),
        "{duplicate:?}"
    );
    assert!(
        matches!(&first, Ok(Handled::Processed { lease, .. }) if lease.attempt == 2),
        "{first:?}"
    );
}

#[test]
fn retries_are_counted_with_mode_lease() {
    let ((), snap) = support::recorded(|| async {
        let inbox = inbox(InboxConfig {
            handler_retry: HandlerRetry::immediate(2),
            log_duplicates: DuplicateLog::WithMessageIds,
            ..InboxConfig::default()
        });
        let runs = AtomicU32::new(0);
        let handled = inbox
            .handle(&key(), None, |_| {
                let run = runs.fetch_add(1, Ordering::SeqCst);
                async move {
                    if run < 2 {
                        Err(Transient::new(timeout()))
                    } else {
                        Ok(None)
                    }
                }
            })
            .await;
        assert!(matches!(handled, Ok(Handled::Processed { .. })));
    });
    assert_eq!(
        snap.counter(
            m::HANDLER_RETRIES_TOTAL,
            &[("mode", "lease"), ("reason", "transient")]
        ),
        2
    );
    assert_eq!(
        snap.observations(
            m::HANDLER_DURATION_SECONDS,
            &[("mode", "lease"), ("result", "error")]
        ),
        2
    );
}
