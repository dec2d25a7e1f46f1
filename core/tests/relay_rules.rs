//! The outbox relay's configuration (each builder sets its own field and keeps the
//! others), and the totals a started relay gives back when it stops.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::layers::metric_names as names;
use dedup_core::outbox::{
    MemoryOutbox, MemoryPublisher, OutboxMessage, OutboxQuery, OutboxRow, OutboxStore, Publisher,
    Relay, RelayConfig, RelayRound,
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

/// A publisher that, while it publishes a row named `stolen-*`, lets that row's hold run
/// out on the store's clock and has another relay take it: the first relay's mark is then
/// refused. It answers `stolen-ok` with success and `stolen-failing` with a failure. It
/// publishes the other rows through `inner`.
#[derive(Debug)]
struct Thief {
    outbox: MemoryOutbox,
    clock: Arc<ManualClock>,
    hold: Duration,
    stolen: AtomicU32,
    inner: MemoryPublisher,
}

impl Thief {
    fn new(outbox: &MemoryOutbox, clock: Arc<ManualClock>, hold: Duration) -> Self {
        Thief {
            outbox: outbox.clone(),
            clock,
            hold,
            stolen: AtomicU32::new(0),
            inner: MemoryPublisher::new(),
        }
    }
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
        if !row.message_id.starts_with("stolen-") {
            return self.inner.publish(row).await;
        }
        self.clock.advance(self.hold + Duration::from_secs(1));
        // The other relay holds it long, past this test's later steals.
        let held = self.outbox.take(1, Duration::from_secs(3600)).await?;
        let taken: Vec<i64> = held.rows.iter().map(|r| r.id).collect();
        assert_eq!(taken, [row.id], "the other relay takes the row");
        self.stolen.fetch_add(1, Ordering::SeqCst);
        match row.message_id.as_str() {
            "stolen-ok" => Ok(()),
            _ => Err("the broker refused it".into()),
        }
    }
}

#[tokio::test]
async fn a_stopped_relay_gives_back_the_totals_of_all_its_rounds() {
    let clock = Arc::new(ManualClock::starting_now());
    let outbox = MemoryOutbox::with_clock(clock.clone());
    let msg = |id: &str| OutboxMessage::new("orders", id, b"{}".to_vec()).unwrap();
    outbox
        .enqueue(&[
            msg("ok-1"),
            msg("ok-2"),
            msg("flaky-1"),
            msg("flaky-2"),
            msg("stolen-ok"),
            msg("stolen-failing"),
        ])
        .unwrap();
    let hold = Duration::from_secs(30);
    let thief = Arc::new(Thief::new(&outbox, clock, hold));
    thief.inner.fail("flaky-1", None);
    thief.inner.fail("flaky-2", None);
    // One row a round, one round at a time: the ok rows are sent; each flaky row fails,
    // is due again at once, and is dead at its second attempt; the marks of the stolen
    // rows are refused.
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
        if thief.stolen.load(Ordering::SeqCst) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(thief.stolen.load(Ordering::SeqCst), 2, "both rows stolen");
    // The rounds before the last one are counted as they end.
    assert_eq!((handle.sent(), handle.dead()), (2, 2));
    // The round of the last stolen row finishes within the stop grace.
    let all = handle.stop().await;
    let expected = RelayRound {
        taken: 8,
        sent: 2,
        failed: 2,
        dead: 2,
        lost: 2,
        handed_back: 0,
    };
    assert_eq!(all, expected);
}

/// Paused tokio time: the rounds of a minute take no real time.
#[test]
fn the_first_round_loop_reads_the_gauges_once_per_stats_interval() {
    support::recorded_live(|snapshotter| async move {
        let pending = || support::Recorded::take(&snapshotter).gauge(names::OUTBOX_PENDING, &[]);
        let outbox = MemoryOutbox::new();
        let publisher = MemoryPublisher::new();
        publisher.fail("stuck", None);
        let mut config = RelayConfig::default()
            .rounds_in_flight(1)
            .backoff(Backoff::Immediate)
            .max_attempts(100)
            .retention(None);
        config.stats_interval = Duration::from_secs(3600);
        let handle = Relay::new(Arc::new(outbox.clone()), Arc::new(publisher))
            .with_config(config)
            .start()
            .expect("the relay starts");
        // The one round loop reads the gauges before its first take.
        for _ in 0..100 {
            if pending().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            pending(),
            Some(0.0),
            "read at the start, on an empty outbox"
        );
        let stuck = OutboxMessage::new("orders", "stuck", b"{}".to_vec()).unwrap();
        outbox.enqueue(&[stuck]).unwrap();
        // Rounds go on: the row fails each time and is due again at once.
        for _ in 0..1000 {
            let rows = outbox.list(&OutboxQuery::default()).await.unwrap();
            if rows[0].row.attempts >= 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let rows = outbox.list(&OutboxQuery::default()).await.unwrap();
        assert!(rows[0].row.attempts >= 3, "{rows:?}");
        assert_eq!(
            pending(),
            Some(0.0),
            "not read again before the stats interval, however many rounds"
        );
        handle.stop().await;
    });
}

/// A publisher standing for a producer that commits a row just after a relay's take: it
/// writes `next` to the outbox while it publishes `first`.
#[derive(Debug)]
struct Producer {
    outbox: MemoryOutbox,
    first: &'static str,
    next: &'static str,
    inner: MemoryPublisher,
}

#[async_trait]
impl Publisher for Producer {
    fn name(&self) -> &'static str {
        "producer"
    }
    fn delivery_timeout(&self) -> Duration {
        Duration::ZERO
    }
    async fn publish(&self, row: &OutboxRow) -> Result<(), BoxError> {
        if row.message_id == self.first {
            let next = OutboxMessage::new("orders", self.next, b"{}".to_vec())?;
            self.outbox.enqueue(&[next])?;
        }
        self.inner.publish(row).await
    }
}

/// Paused tokio time. The memory outbox sends no wake-ups: only the linger brings the
/// second row out before the hour's poll.
#[tokio::test(start_paused = true)]
async fn after_a_round_that_took_rows_the_relay_looks_again_after_the_linger() {
    let outbox = MemoryOutbox::new();
    outbox
        .enqueue(&[OutboxMessage::new("orders", "a", b"{}".to_vec()).unwrap()])
        .unwrap();
    let publisher = Arc::new(Producer {
        outbox: outbox.clone(),
        first: "a",
        next: "b",
        inner: MemoryPublisher::new(),
    });
    let handle = Relay::new(Arc::new(outbox.clone()), publisher.clone())
        .with_config(
            RelayConfig::default()
                .rounds_in_flight(1)
                .poll_interval(Duration::from_secs(3600))
                .linger(Duration::from_millis(20))
                .retention(None),
        )
        .start()
        .expect("the relay starts");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(publisher.inner.message_ids(), ["a", "b"]);
    handle.stop().await;
}

#[test]
fn the_pending_gauge_counts_the_held_rows_too() {
    let ((), snap) = support::recorded(|| async {
        let outbox = MemoryOutbox::new();
        let msg = |id: &str| OutboxMessage::new("orders", id, b"{}".to_vec()).unwrap();
        outbox
            .enqueue(&[msg("elsewhere"), msg("p1"), msg("p2")])
            .unwrap();
        // Another relay holds the first row.
        let held = outbox.take(1, Duration::from_secs(3600)).await.unwrap();
        assert_eq!(held.rows.len(), 1);
        let publisher = MemoryPublisher::new();
        let mut config = RelayConfig::default().rounds_in_flight(1).retention(None);
        config.stats_interval = Duration::from_secs(3600);
        let handle = Relay::new(Arc::new(outbox.clone()), Arc::new(publisher.clone()))
            .with_config(config)
            .start()
            .expect("the relay starts");
        for _ in 0..100 {
            if publisher.message_ids().len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(publisher.message_ids(), ["p1", "p2"]);
        handle.stop().await;
    });
    assert_eq!(
        snap.gauge(names::OUTBOX_PENDING, &[]),
        Some(3.0),
        "read before the first take: 2 pending and 1 held"
    );
}

#[test]
fn only_a_round_that_lost_marks_counts_them_and_warns() {
    let logged = support::warnings::Warnings::default();
    let _guard = tracing::subscriber::set_default(logged.clone());
    let hold_ran_out = || {
        (logged.seen().iter())
            .filter(|w| w["message"].contains("hold ran out"))
            .count()
    };
    let ((), snap) = support::recorded(|| async {
        let clock = Arc::new(ManualClock::starting_now());
        let outbox = MemoryOutbox::with_clock(clock.clone());
        let hold = Duration::from_secs(30);
        let relay = Relay::new(
            Arc::new(outbox.clone()),
            Arc::new(Thief::new(&outbox, clock, hold)),
        )
        .with_config(RelayConfig::default().hold(hold).retention(None));
        let msg = |id: &str| OutboxMessage::new("orders", id, b"{}".to_vec()).unwrap();
        outbox.enqueue(&[msg("ok")]).unwrap();
        let round = relay.run_once().await.unwrap();
        assert_eq!((round.sent, round.lost), (1, 0), "{round:?}");
        assert_eq!(
            hold_ran_out(),
            0,
            "no warning for a round that lost nothing"
        );
        outbox.enqueue(&[msg("stolen-ok")]).unwrap();
        let round = relay.run_once().await.unwrap();
        assert_eq!((round.sent, round.lost), (0, 1), "{round:?}");
    });
    assert_eq!(hold_ran_out(), 1);
    assert_eq!(snap.counter(names::OUTBOX_LOST_MARKS_TOTAL, &[]), 1);
}
