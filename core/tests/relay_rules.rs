//! The outbox relay's configuration (each builder sets its own field and keeps the
//! others), and the totals a started relay gives back when it stops.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::outbox::{
    MemoryOutbox, MemoryPublisher, OutboxMessage, OutboxRow, OutboxStore, Publisher, Relay,
    RelayConfig, RelayRound,
};
use dedup_core::{Backoff, BoxError, ManualClock, Retention};

#[test]
fn each_builder_sets_its_own_field() {
    let config = RelayConfig::default()
        .batch_size(7)
        .hold(Duration::from_secs(60))
        .mark_margin(Duration::from_secs(9))
        .poll_interval(Duration::from_millis(250))
        .max_attempts(3)
        .backoff(Backoff::Interval(Duration::from_secs(2)))
        .rounds_in_flight(2)
        .linger(Duration::from_millis(5))
        .retention(None)
        .stop_grace(Duration::from_secs(4));
    let expected = {
        let mut c = RelayConfig::default();
        c.batch_size = 7;
        c.hold = Duration::from_secs(60);
        c.mark_margin = Duration::from_secs(9);
        c.poll_interval = Duration::from_millis(250);
        c.max_attempts = 3;
        c.backoff = Backoff::Interval(Duration::from_secs(2));
        c.rounds_in_flight = 2;
        c.linger = Duration::from_millis(5);
        c.retention = None;
        c.stop_grace = Duration::from_secs(4);
        c
    };
    assert_eq!(config, expected);
    assert_ne!(config, RelayConfig::default(), "every field moved");
}

#[test]
fn a_relay_runs_at_least_one_round_at_once() {
    assert_eq!(
        RelayConfig::default().rounds_in_flight(0).rounds_in_flight,
        1
    );
    assert_eq!(RelayConfig::default().rounds_in_flight, 4);
}

#[test]
fn the_retention_builder_keeps_a_given_policy() {
    let retention = Retention::default();
    let config = RelayConfig::default()
        .retention(None)
        .retention(Some(retention));
    assert_eq!(config.retention, Some(retention));
}

#[test]
fn a_relay_keeps_the_configuration_it_is_given() {
    let config = RelayConfig::default().batch_size(3).max_attempts(2);
    let relay = Relay::new(
        Arc::new(MemoryOutbox::new()),
        Arc::new(MemoryPublisher::new()),
    )
    .with_config(config.clone());
    assert_eq!(relay.config(), &config);
}

/// A publisher that, while it publishes the row `stolen`, lets that row's hold run out on
/// the store's clock and has another relay take it: the first relay's mark is then
/// refused. It publishes the other rows through `inner`.
#[derive(Debug)]
struct Thief {
    outbox: MemoryOutbox,
    clock: Arc<ManualClock>,
    hold: Duration,
    stole: AtomicBool,
    inner: MemoryPublisher,
}

#[async_trait]
impl Publisher for Thief {
    fn name(&self) -> &'static str {
        "thief"
    }
    fn delivery_timeout(&self) -> Duration {
        Duration::ZERO
    }
    async fn publish(&self, row: &OutboxRow) -> Result<(), BoxError> {
        if row.message_id == "stolen" && !self.stole.load(Ordering::SeqCst) {
            self.clock.advance(self.hold + Duration::from_secs(1));
            let held = self.outbox.take(10, self.hold).await?;
            assert_eq!(held.rows.len(), 1, "the other relay takes the row");
            self.stole.store(true, Ordering::SeqCst);
            return Ok(());
        }
        self.inner.publish(row).await
    }
}

#[tokio::test]
async fn a_stopped_relay_gives_back_the_totals_of_all_its_rounds() {
    let clock = Arc::new(ManualClock::starting_now());
    let outbox = MemoryOutbox::with_clock(clock.clone());
    let msg = |id: &str| OutboxMessage::new("orders", id, b"{}".to_vec()).unwrap();
    outbox
        .enqueue(&[msg("ok"), msg("flaky"), msg("stolen")])
        .unwrap();
    let hold = Duration::from_secs(30);
    let thief = Arc::new(Thief {
        outbox: outbox.clone(),
        clock,
        hold,
        stole: AtomicBool::new(false),
        inner: MemoryPublisher::new(),
    });
    thief.inner.fail("flaky", None);
    // One row a round, one round at a time: ok is sent; flaky fails, is due again at
    // once, and is dead at its second attempt; stolen's mark is refused.
    let handle = Relay::new(Arc::new(outbox.clone()), thief.clone())
        .with_config(
            RelayConfig::default()
                .batch_size(1)
                .rounds_in_flight(1)
                .hold(hold)
                .max_attempts(2)
                .backoff(Backoff::Immediate)
                .retention(None),
        )
        .start()
        .expect("the relay starts");
    for _ in 0..500 {
        if thief.stole.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        thief.stole.load(Ordering::SeqCst),
        "the last row was stolen"
    );
    // The round of the stolen row finishes within the stop grace.
    let all = handle.stop().await;
    let expected = RelayRound {
        taken: 4,
        sent: 1,
        failed: 1,
        dead: 1,
        lost: 1,
        handed_back: 0,
    };
    assert_eq!(all, expected);
}
