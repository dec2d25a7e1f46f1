//! Inbox behaviour, on MemoryStore with a clock that follows tokio's (paused) time, so
//! "slow" handlers take no real time.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dedup_core::layers::RetryPolicy;
use dedup_core::{
    Claim, ClaimOptions, DedupStore, Handled, Inbox, InboxConfig, InboxError, Key, MemoryStore,
    RecordState,
};

fn inbox(lease: Duration) -> Inbox<MemoryStore> {
    Inbox::new(support::tokio_store()).with_config(InboxConfig {
        lease,
        ..InboxConfig::default()
    })
}

fn key() -> Key {
    Key::new("billing", "order-1").unwrap()
}

/// The first attempt on `key()` was released: the next delivery acquires at once, as
/// attempt 2.
async fn assert_released(inbox: &Inbox<MemoryStore>) {
    let c = inbox
        .store()
        .claim(&key(), &ClaimOptions::default())
        .await
        .unwrap();
    assert!(
        matches!(c, Claim::Acquired(ref l) if l.attempt == 2),
        "{c:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn success_commits_with_the_outcome_and_duplicates_get_it_back() {
    let inbox = inbox(Duration::from_secs(30));
    let runs = AtomicU32::new(0);
    let handler = |_lease| async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::io::Error>(Some(b"invoice-7".to_vec()))
    };
    let first = inbox.handle(&key(), None, handler).await.unwrap();
    assert!(
        matches!(&first, Handled::Processed { outcome: Some(o), lease } if o == b"invoice-7" && lease.fence == 1)
    );
    let rec = inbox.store().get(&key()).await.unwrap().unwrap();
    assert!(
        matches!(rec.state, RecordState::Completed { outcome: Some(ref o), .. } if o == b"invoice-7")
    );
    let second = inbox.handle(&key(), None, handler).await.unwrap();
    assert!(matches!(second, Handled::Duplicate { outcome: Some(o), .. } if o == b"invoice-7"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn handler_error_releases_so_the_next_delivery_retries_at_once() {
    let inbox = inbox(Duration::from_secs(30));
    let err = inbox
        .handle(&key(), None, |_| async {
            Err::<Option<Vec<u8>>, _>("payment api down")
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, InboxError::Handler { source, .. } if source.to_string() == "payment api down"),
        "{err:?}"
    );
    // No waiting for the 30 s lease: the retry acquires immediately, as attempt 2.
    let again = inbox
        .handle(&key(), None, |lease| async move {
            assert_eq!((lease.fence, lease.attempt), (2, 2));
            Ok::<_, &str>(None)
        })
        .await
        .unwrap();
    assert!(matches!(again, Handled::Processed { outcome: None, .. }));
}

#[tokio::test(start_paused = true)]
async fn busy_while_another_worker_holds_a_live_lease() {
    let inbox = inbox(Duration::from_secs(30));
    let other = inbox
        .store()
        .claim(&key(), &ClaimOptions::lease(Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(other.is_acquired());
    let res = inbox
        .handle(&key(), None, |_| async { Ok::<_, &str>(None) })
        .await
        .unwrap();
    assert!(matches!(res, Handled::Busy { attempt: 1, .. }));
}

#[tokio::test(start_paused = true)]
async fn renewal_keeps_a_slow_handlers_lease_alive_past_its_initial_expiry() {
    let inbox = inbox(Duration::from_secs(3));
    let store = inbox.store().clone();
    let probe = async {
        // At 5 s and 9 s the first lease (3 s) would long be over without renewal.
        let mut seen = Vec::new();
        for wait in [5, 4] {
            tokio::time::sleep(Duration::from_secs(wait)).await;
            let opts = ClaimOptions::lease(Duration::from_secs(3));
            seen.push(store.claim(&key(), &opts).await.unwrap());
        }
        seen
    };
    let k = key();
    let work = inbox.handle(&k, None, |_lease| async {
        tokio::time::sleep(Duration::from_secs(10)).await;
        Ok::<_, &str>(Some(b"done".to_vec()))
    });
    let (seen, result) = tokio::join!(probe, work);
    for claim in seen {
        assert!(
            matches!(claim, Claim::InFlight { attempt: 1, .. }),
            "{claim:?}"
        );
    }
    assert!(matches!(result.unwrap(), Handled::Processed { .. }));
}

#[tokio::test(start_paused = true)]
async fn without_renewal_the_lease_of_a_slow_handler_is_taken_over() {
    // The control for the test above: with renewals far apart the probe takes the key over,
    // and the slow handler's commit is rejected.
    let inbox = inbox(Duration::from_secs(3)).with_config(InboxConfig {
        lease: Duration::from_secs(3),
        renew_every: Some(Duration::from_secs(3600)),
        commit_retry: RetryPolicy::NEVER,
        ..InboxConfig::default()
    });
    let store = inbox.store().clone();
    let probe = async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        store
            .claim(&key(), &ClaimOptions::lease(Duration::from_secs(60)))
            .await
            .unwrap()
    };
    let k = key();
    let work = inbox.handle(&k, None, |_| async {
        tokio::time::sleep(Duration::from_secs(10)).await;
        Ok::<_, &str>(None)
    });
    let (taken, result) = tokio::join!(probe, work);
    assert!(matches!(taken, Claim::Acquired(ref l) if l.fence == 2));
    assert!(matches!(result, Err(InboxError::LeaseLost { .. })));
}

#[tokio::test(start_paused = true)]
async fn a_panicking_handler_releases_the_key_then_panics() {
    let inbox = inbox(Duration::from_secs(30));
    let i2 = inbox.clone();
    let joined = tokio::spawn(async move {
        i2.handle(&key(), None, |_| async {
            panic!("bug in handler");
            #[allow(unreachable_code)]
            Ok::<_, &str>(None)
        })
        .await
    })
    .await;
    assert!(joined.unwrap_err().is_panic());
    assert_released(&inbox).await;
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_handler_releases_the_key() {
    let inbox = inbox(Duration::from_secs(30));
    let i2 = inbox.clone();
    let task = tokio::spawn(async move {
        i2.handle(&key(), None, |_| async {
            tokio::time::sleep(Duration::from_secs(1000)).await;
            Ok::<_, &str>(None)
        })
        .await
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    task.abort();
    let _ = task.await;
    tokio::task::yield_now().await; // let the background release run
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_released(&inbox).await;
}

#[tokio::test(start_paused = true)]
async fn inbox_error_converts_with_question_mark_whatever_the_handler_error() {
    async fn with_anyhow(inbox: &Inbox<MemoryStore>) -> anyhow::Result<Handled> {
        let k = Key::new("billing", "anyhow")?;
        Ok(inbox
            .handle(&k, None, |_| async {
                Err::<Option<Vec<u8>>, _>(anyhow::anyhow!("gateway timeout"))
            })
            .await?)
    }
    async fn with_box(
        inbox: &Inbox<MemoryStore>,
    ) -> Result<Handled, Box<dyn std::error::Error + Send + Sync>> {
        let k = Key::new("billing", "io")?;
        Ok(inbox
            .handle(&k, None, |_| async {
                Err::<Option<Vec<u8>>, _>(std::io::Error::other("disk full"))
            })
            .await?)
    }
    let inbox = inbox(Duration::from_secs(30));
    let err = with_anyhow(&inbox).await.unwrap_err();
    // The chain is kept: InboxError, then the handler's own error as its source.
    assert_eq!(
        format!("{err:#}"),
        "handler failed for billing/anyhow at attempt 1; the lease was released for a retry: gateway timeout"
    );
    let err = with_box(&inbox).await.unwrap_err();
    let inbox_err = err.downcast_ref::<InboxError>().unwrap();
    let io = inbox_err.handler_error::<std::io::Error>().unwrap();
    assert_eq!(io.to_string(), "disk full");
    assert!(inbox_err.handler_error::<std::fmt::Error>().is_none());
}

#[tokio::test(start_paused = true)]
async fn commits_are_retried_with_the_retry_layers_policy() {
    // With the default policy (3 retries) a commit that fails twice with a retryable error
    // succeeds on its third try.
    let store = support::flaky(0, true);
    let inbox = Inbox::new(store);
    let k = key();
    let handled = inbox
        .handle(&k, None, |_| async {
            inbox.store().fail.store(2, Ordering::SeqCst); // the next two calls (commits) fail
            Ok::<_, &str>(Some(b"ok".to_vec()))
        })
        .await
        .unwrap();
    assert!(matches!(handled, Handled::Processed { .. }));
    assert_eq!(inbox.store().fail.load(Ordering::SeqCst), 0);

    // RetryPolicy::NEVER: the first retryable failure is final.
    let inbox = inbox.with_config(InboxConfig {
        commit_retry: RetryPolicy::NEVER,
        ..InboxConfig::default()
    });
    let k2 = Key::new("billing", "order-2").unwrap();
    let err = inbox
        .handle(&k2, None, |_| async {
            inbox.store().fail.store(1, Ordering::SeqCst);
            Ok::<_, &str>(None)
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, InboxError::Store(ref e) if e.is_retryable()),
        "{err:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_outcome_starting_with_the_reserved_bytes_is_refused_and_the_key_released() {
    let inbox = inbox(Duration::from_secs(30));
    let err = inbox
        .handle(&key(), None, |_| async {
            Ok::<_, &str>(Some(b"\0dedup:failed\0forged".to_vec()))
        })
        .await
        .unwrap_err();
    assert!(matches!(err, InboxError::Outcome { .. }), "{err:?}");
    assert_released(&inbox).await;
}
