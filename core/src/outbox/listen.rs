//! The relay's listener: the store's wake-ups, listened to again after they are lost.

use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{Notify, watch};

use super::OutboxStore;
use crate::error_chain;

/// The first delay before listening again after the wake-ups were lost; it doubles after
/// each failed try, up to the relay's poll interval, and at most [`RELISTEN_MOST`].
pub(super) const RELISTEN_FIRST: Duration = Duration::from_millis(100);
/// The longest delay between two tries to listen again.
pub(super) const RELISTEN_MOST: Duration = Duration::from_secs(5);

/// Listen for `store`'s wake-ups and wake every round loop through `woken`, until
/// `stopped`. When the wake-ups are lost (the stream failed or ended, or cannot be opened:
/// the database is down), the round loops poll meanwhile, and this listens again with
/// backoff. It logs a warning once when they are lost (with the cause chain) and once at
/// `info` when it listens again; each try between is logged at `debug`. A store without
/// wake-ups (`Ok(None)`) is polled only.
pub(super) async fn listen<S: OutboxStore + ?Sized>(
    store: &S,
    poll_interval: Duration,
    woken: &Notify,
    mut stopped: watch::Receiver<bool>,
) {
    let most = poll_interval.clamp(RELISTEN_FIRST, RELISTEN_MOST);
    let mut delay = RELISTEN_FIRST;
    let mut lost = false;
    loop {
        let subscribed = tokio::select! {
            _ = stopped.changed() => return,
            subscribed = store.wakeups() => subscribed,
        };
        let cause = match subscribed {
            Ok(None) => return,
            Err(e) => Some(e),
            Ok(Some(mut stream)) => {
                if lost {
                    tracing::info!(
                        backend = store.backend(),
                        "dedup outbox relay: listening for notifications again"
                    );
                    lost = false;
                    // Rows written while nobody listened: look now, not at the next poll.
                    woken.notify_waiters();
                }
                delay = RELISTEN_FIRST;
                loop {
                    tokio::select! {
                        _ = stopped.changed() => return,
                        next = stream.next() => match next {
                            Some(Ok(())) => woken.notify_waiters(),
                            Some(Err(e)) => break Some(e),
                            None => break None,
                        },
                    }
                }
            }
        };
        let cause = cause.map_or_else(
            || "the notification stream ended".to_owned(),
            |e| error_chain(&e),
        );
        if lost {
            tracing::debug!(backend = store.backend(), cause = %cause, retry_in = ?delay, "dedup outbox relay: still cannot listen for notifications");
        } else {
            tracing::warn!(backend = store.backend(), cause = %cause, poll_interval = ?poll_interval, "dedup outbox relay: cannot listen for notifications; polling, and listening again as soon as the store answers");
            lost = true;
        }
        tokio::select! {
            _ = stopped.changed() => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(most);
    }
}
