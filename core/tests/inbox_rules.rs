//! The lease-mode `Inbox`'s rules that its other tests leave loose: what a delivery answers
//! when the release before a handler's run again fails, and when a renewal fails; what a
//! failed attempt's release does when the store refuses it. On MemoryStore, with tokio's
//! paused clock where time matters.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dedup_core::{
    Claim, ClaimOptions, DedupStore, Handled, HandlerRetry, Inbox, InboxConfig, InboxError, Key,
    Transient,
};

fn key() -> Key {
    Key::new("couriers", "parcel-9").unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_key_taken_over_during_the_delay_before_a_run_again_is_lease_lost() {
    let store = Arc::new(support::tokio_store());
    // A 1 s lease, never renewed in time: it runs out during the 2 s delay.
    let inbox = Inbox::from_arc(
        Arc::clone(&store),
        InboxConfig {
            lease: Duration::from_secs(1),
            renew_every: Some(Duration::from_secs(3600)),
            handler_retry: HandlerRetry::interval(1, Duration::from_secs(2)),
            ..InboxConfig::default()
        },
    );
    let delivery = tokio::spawn(async move {
        inbox
            .handle(&key(), None, |_lease| async {
                Err::<Option<Vec<u8>>, _>(Transient::new("courier API timed out"))
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let options = ClaimOptions {
        lease: Duration::from_secs(60),
        fingerprint: None,
    };
    let other = store.claim(&key(), &options).await.unwrap();
    assert!(
        matches!(&other, Claim::Acquired(lease) if lease.attempt == 2),
        "another worker takes the key over: {other:?}"
    );
    let handled = delivery.await.unwrap();
    assert!(
        matches!(&handled, Err(InboxError::LeaseLost { key: k }) if *k == key()),
        "{handled:?}"
    );
}

#[tokio::test]
async fn a_store_error_at_the_release_before_a_run_again_is_a_store_error() {
    let inbox = Inbox::new(support::flaky(0, false)).with_config(InboxConfig {
        handler_retry: HandlerRetry::immediate(1),
        ..InboxConfig::default()
    });
    let handled = inbox
        .handle(&key(), None, |_lease| {
            // The store's next operation, the release, fails.
            inbox.store().fail.store(1, Ordering::SeqCst);
            async { Err::<Option<Vec<u8>>, _>(Transient::new("courier API timed out")) }
        })
        .await;
    assert!(
        matches!(&handled, Err(InboxError::Store(e)) if !e.is_lease_lost()),
        "{handled:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_fails_for_a_while_keeps_the_handler_running() {
    let inbox = Inbox::new(support::flaky(0, true)).with_config(InboxConfig {
        renew_every: Some(Duration::from_millis(5)),
        ..InboxConfig::default()
    });
    let handled = inbox
        .handle(&key(), None, |_lease| {
            // The next two renewals fail (a dropped connection); later ones work.
            inbox.store().fail.store(2, Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok::<_, std::io::Error>(Some(b"booked".to_vec()))
            }
        })
        .await;
    assert!(
        matches!(handled, Ok(Handled::Processed { .. })),
        "{handled:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_renewal_answering_lease_lost_drops_the_handler_at_once() {
    let store = Arc::new(support::tokio_store());
    let inbox = Inbox::from_arc(
        Arc::clone(&store),
        InboxConfig {
            renew_every: Some(Duration::from_millis(100)),
            ..InboxConfig::default()
        },
    );
    let finished = AtomicBool::new(false);
    let started = tokio::time::Instant::now();
    let handled = inbox
        .handle(&key(), None, |lease| {
            let (store, finished) = (Arc::clone(&store), &finished);
            async move {
                // The key is let go and another worker takes it.
                store.release(&lease).await.unwrap();
                let other = store.claim(&key(), &ClaimOptions::default()).await.unwrap();
                assert!(matches!(other, Claim::Acquired(_)), "{other:?}");
                tokio::time::sleep(Duration::from_secs(10)).await;
                finished.store(true, Ordering::SeqCst);
                Ok::<_, std::io::Error>(None)
            }
        })
        .await;
    assert!(
        matches!(&handled, Err(InboxError::LeaseLost { .. })),
        "{handled:?}"
    );
    assert!(
        !finished.load(Ordering::SeqCst),
        "dropped at its next await"
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(100),
        "at the first renewal"
    );
}

#[test]
fn a_transient_error_displays_as_the_error_it_wraps_and_keeps_it_as_its_source() {
    let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "courier API timed out");
    let transient = Transient::new(io);
    assert_eq!(transient.to_string(), "courier API timed out");
    let source = std::error::Error::source(&transient).expect("the wrapped error");
    assert_eq!(source.to_string(), "courier API timed out");
    assert!(source.is::<std::io::Error>(), "{source:?}");
}

/// A handler that fails with a plain error (not transient) at once.
async fn declined(_lease: dedup_core::Lease) -> Result<Option<Vec<u8>>, &'static str> {
    Err("card declined")
}

#[tokio::test]
async fn a_failure_kept_on_the_record_has_the_time_it_happened() {
    let inbox = Inbox::new(dedup_core::MemoryStore::new());
    let before = dedup_core::Timestamp::from_system_time(std::time::SystemTime::now());
    assert!(inbox.handle(&key(), None, declined).await.is_err());
    let after = dedup_core::Timestamp::from_system_time(std::time::SystemTime::now());
    let record = inbox.store().get(&key()).await.unwrap().unwrap();
    let failure = record.last_failure.expect("the failure kept");
    assert!(
        before <= failure.at && failure.at <= after,
        "{before:?} <= {:?} <= {after:?}",
        failure.at
    );
}

#[tokio::test]
async fn a_failure_the_store_cannot_keep_still_releases_the_key_and_warns() {
    let logged = support::warnings::Warnings::default();
    let _guard = tracing::subscriber::set_default(logged.clone());
    let inbox = Inbox::new(support::flaky(0, false));
    let handled = inbox
        .handle(&key(), None, |lease| {
            // The store's next operation, the release that keeps the failure, fails.
            inbox.store().fail.store(1, Ordering::SeqCst);
            declined(lease)
        })
        .await;
    assert!(
        matches!(handled, Err(InboxError::Handler { .. })),
        "{handled:?}"
    );
    let warned = logged.seen();
    assert!(
        warned
            .iter()
            .any(|w| w["message"].contains("could not be kept")),
        "{warned:?}"
    );
    // Released without it: the next delivery runs at once, as attempt 2.
    let again = inbox
        .handle(&key(), None, |lease| async move {
            Ok::<_, std::io::Error>(Some(lease.attempt.to_string().into_bytes()))
        })
        .await;
    assert!(
        matches!(&again, Ok(Handled::Processed { outcome: Some(o), .. }) if o == b"2"),
        "{again:?}"
    );
}

#[tokio::test]
async fn a_failed_attempt_whose_key_was_taken_over_is_left_to_its_new_owner_quietly() {
    let logged = support::warnings::Warnings::default();
    let _guard = tracing::subscriber::set_default(logged.clone());
    let store = Arc::new(dedup_core::MemoryStore::new());
    let inbox = Inbox::from_arc(Arc::clone(&store), InboxConfig::default());
    let handled = inbox
        .handle(&key(), None, |lease| {
            let store = Arc::clone(&store);
            async move {
                // The key is let go and another worker takes it, then this run fails.
                store.release(&lease).await.unwrap();
                let other = store.claim(&key(), &ClaimOptions::default()).await.unwrap();
                assert!(matches!(other, Claim::Acquired(_)), "{other:?}");
                Err::<Option<Vec<u8>>, _>("card declined")
            }
        })
        .await;
    assert!(
        matches!(handled, Err(InboxError::Handler { .. })),
        "{handled:?}"
    );
    let warned = logged.seen();
    assert!(
        !warned
            .iter()
            .any(|w| w["message"].contains("could not be kept")),
        "a lost lease is no store failure: {warned:?}"
    );
}

#[tokio::test]
async fn a_busy_answer_is_not_settled_and_a_processed_one_is() {
    let store = Arc::new(dedup_core::MemoryStore::new());
    let inbox = Inbox::from_arc(Arc::clone(&store), InboxConfig::default());
    // Another worker holds the key.
    let held = store.claim(&key(), &ClaimOptions::default()).await.unwrap();
    let busy = inbox
        .handle(&key(), None, |_| async { Ok::<_, std::io::Error>(None) })
        .await
        .unwrap();
    assert!(matches!(busy, Handled::Busy { .. }), "{busy:?}");
    assert!(!busy.is_settled(), "nack it: redeliver later");
    store.release(&held.into_lease().unwrap()).await.unwrap();
    let processed = inbox
        .handle(&key(), None, |_| async { Ok::<_, std::io::Error>(None) })
        .await
        .unwrap();
    assert!(processed.is_settled(), "{processed:?}");
}
