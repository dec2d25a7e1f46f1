//! The relay's check of a publisher's delivery timeout against its hold, for each broker.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::Error;
use dedup_core::outbox::{MemoryOutbox, OutboxMessage, OutboxStore, Publisher, Relay, RelayConfig};

/// `default` (a publisher as its constructor makes it) fits a relay's default
/// configuration; `slow` (the same publisher with a `timeout` longer than the default hold)
/// is refused at `start` and `run_once` with an error naming both durations, and nothing is
/// taken; a hold longer than `timeout` plus the mark margin takes it.
pub async fn assert_relay_checks_timeout(
    default: Arc<dyn Publisher>,
    slow: Arc<dyn Publisher>,
    timeout: Duration,
) {
    let outbox = MemoryOutbox::new();
    let message = OutboxMessage::new("orders", "timed-1", b"x".to_vec()).unwrap();
    outbox.enqueue(&[message]).unwrap();
    let store: Arc<dyn OutboxStore> = Arc::new(outbox.clone());
    let hold = RelayConfig::default().hold;
    assert!(
        default.delivery_timeout() + RelayConfig::default().mark_margin < hold,
        "{} by default: {:?}",
        default.name(),
        default.delivery_timeout()
    );
    Relay::new(Arc::clone(&store), default).check().unwrap();

    assert_eq!(slow.delivery_timeout(), timeout);
    let relay = Relay::new(Arc::clone(&store), Arc::clone(&slow));
    let refused = relay
        .clone()
        .start()
        .expect_err("a publisher outlasting the hold");
    let text = refused.to_string();
    match refused {
        Error::PublisherOutlastsHold {
            publisher,
            delivery_timeout,
            hold: refused_hold,
            ..
        } => {
            assert_eq!(publisher, slow.name());
            assert_eq!(delivery_timeout, timeout);
            assert_eq!(refused_hold, hold);
        }
        other => panic!("not PublisherOutlastsHold: {other:?}"),
    }
    for value in [format!("{timeout:?}"), format!("{hold:?}")] {
        assert!(text.contains(&value), "{value} not in {text:?}");
    }
    assert!(matches!(
        relay.run_once().await,
        Err(Error::PublisherOutlastsHold { .. })
    ));
    let stats = outbox.stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.held),
        (1, 0),
        "nothing taken: {stats:?}"
    );

    let longer = RelayConfig::default().hold(timeout + Duration::from_secs(6));
    Relay::new(store, slow).with_config(longer).check().unwrap();
}
