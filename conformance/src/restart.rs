//! Server restarts: the scenario a server-backed store runs against a real server that its
//! test kills and restarts (how it restarts is the backend's business).

use std::future::Future;
use std::time::{Duration, Instant};

use dedup_core::{Claim, ClaimOptions, DedupStore, Key, Result};

/// Run `op` until it succeeds, while a store reconnects after its server restarted.
///
/// Every failure on the way must be retryable ([`dedup_core::Error::is_retryable`]), and
/// success must come within 30 seconds; otherwise this panics.
pub async fn until_reconnected<T, F, Fut>(mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(
                    e.is_retryable(),
                    "a failure after a restart must be retryable: {e:?}"
                );
                assert!(
                    Instant::now() < deadline,
                    "the store did not reconnect: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn order(i: usize) -> Key {
    Key::new("billing", format!("order-{i}")).expect("key")
}

/// Commit 50 keys with outcomes and hold one live lease; call `restart` (which must kill
/// the server abruptly and start it again on the same data); then require every commit
/// with its outcome, and the live lease, to be there, and its owner able to commit.
/// For servers configured so that an acknowledged write survives a crash.
pub async fn acknowledged_records_survive_a_restart<S>(store: &S, restart: impl FnOnce())
where
    S: DedupStore + ?Sized,
{
    let opts = ClaimOptions::lease(Duration::from_secs(120));
    for i in 0..50 {
        let lease = store.claim(&order(i), &opts).await.expect("claim");
        let lease = lease.into_lease().expect("a fresh key is acquired");
        let outcome = format!("invoice-{i}");
        store
            .commit(&lease, Some(outcome.as_bytes()))
            .await
            .expect("commit");
    }
    let live = store.claim(&order(50), &opts).await.expect("claim");
    let live = live.into_lease().expect("a fresh key is acquired");

    restart();

    for i in 0..50 {
        let k = order(i);
        match until_reconnected(|| store.claim(&k, &opts)).await {
            Claim::Completed { outcome, .. } => {
                assert_eq!(outcome, Some(format!("invoice-{i}").into_bytes()))
            }
            other => panic!("order-{i} was committed before the restart, got {other:?}"),
        }
    }
    let k = order(50);
    match until_reconnected(|| store.claim(&k, &opts)).await {
        Claim::InFlight {
            expires_at,
            attempt,
        } => {
            assert_eq!((expires_at, attempt), (live.expires_at, 1))
        }
        other => panic!("the live lease must survive, got {other:?}"),
    }
    until_reconnected(|| store.commit(&live, None)).await;
}
