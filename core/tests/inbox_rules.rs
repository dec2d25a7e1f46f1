//! The lease-mode `Inbox`'s rules that its other tests leave loose: what a delivery answers
//! when the release before a handler's run again fails. On MemoryStore, with tokio's paused
//! clock where a lease must run out.

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dedup_core::{
    Claim, ClaimOptions, DedupStore, HandlerRetry, Inbox, InboxConfig, InboxError, Key, Transient,
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
