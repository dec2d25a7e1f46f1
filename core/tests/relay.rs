//! The outbox relay's own behaviour on the reference model: its loop, its stop, its
//! metrics. (What it does per store is in the conformance clauses.)

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::BoxError;
use dedup_core::layers::metric_names as names;
use dedup_core::outbox::{
    MemoryOutbox, MemoryPublisher, OutboxMessage, OutboxQuery, OutboxRow, OutboxState, OutboxStore,
    Publisher, Relay, RelayConfig,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

fn msg(id: &str) -> OutboxMessage {
    OutboxMessage::new("orders", id, id.as_bytes().to_vec()).unwrap()
}

/// A publisher that takes `delay` per batch (forever when `None`), then accepts it.
#[derive(Debug)]
struct Slow {
    delay: Option<Duration>,
    inner: MemoryPublisher,
}

#[async_trait]
impl Publisher for Slow {
    fn name(&self) -> &'static str {
        "slow"
    }
    /// `delay`, or (never answering) more than the relay waits: it cuts the call.
    fn delivery_timeout(&self) -> Duration {
        self.delay.unwrap_or(Duration::from_secs(20))
    }
    async fn publish(&self, row: &OutboxRow) -> Result<(), BoxError> {
        match self.delay {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending::<()>().await,
        }
        self.inner.publish(row).await
    }
}

#[tokio::test]
async fn a_started_relay_publishes_rows_committed_after_it_started() {
    let outbox = MemoryOutbox::new();
    let publisher = MemoryPublisher::new();
    let handle = Relay::new(Arc::new(outbox.clone()), Arc::new(publisher.clone()))
        .with_config(RelayConfig::default().poll_interval(Duration::from_millis(10)))
        .start()
        .expect("the relay starts");
    outbox.enqueue(&[msg("a"), msg("b")]).unwrap();
    for _ in 0..200 {
        if publisher.message_ids().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let all = handle.stop().await;
    assert_eq!(publisher.message_ids(), ["a", "b"]);
    assert_eq!(all.sent, 2, "{all:?}");
}

#[tokio::test]
async fn full_batches_are_taken_back_to_back_without_waiting_for_the_poll() {
    let outbox = MemoryOutbox::new();
    let ids: Vec<String> = (0..50).map(|i| format!("m{i}")).collect();
    outbox
        .enqueue(&ids.iter().map(|i| msg(i)).collect::<Vec<_>>())
        .unwrap();
    let publisher = MemoryPublisher::new();
    let handle = Relay::new(Arc::new(outbox.clone()), Arc::new(publisher.clone()))
        .with_config(
            RelayConfig::default()
                .batch_size(5)
                .poll_interval(Duration::from_secs(3600)),
        )
        .start()
        .expect("the relay starts");
    for _ in 0..200 {
        if publisher.message_ids().len() == 50 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    handle.stop().await;
    assert_eq!(
        publisher.message_ids().len(),
        50,
        "ten full batches of 5 and then one empty round, with an hour's poll interval"
    );
}

#[tokio::test]
async fn a_stop_hands_back_rows_whose_publish_does_not_finish_in_the_grace() {
    let outbox = MemoryOutbox::new();
    outbox.enqueue(&[msg("stuck-1"), msg("stuck-2")]).unwrap();
    let inner = MemoryPublisher::new();
    let handle = Relay::new(
        Arc::new(outbox.clone()),
        Arc::new(Slow {
            delay: None,
            inner: inner.clone(),
        }),
    )
    .with_config(RelayConfig::default().stop_grace(Duration::from_millis(50)))
    .start()
    .expect("the relay starts");
    // Let it take the rows.
    for _ in 0..100 {
        if outbox.stats().await.unwrap().held == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let all = handle.stop().await;
    assert_eq!(all.handed_back, 2, "{all:?}");
    let rows = outbox.list(&OutboxQuery::default()).await.unwrap();
    assert!(
        rows.iter()
            .all(|e| e.state == OutboxState::Pending && e.row.attempts == 0),
        "handed back, attempt not counted: {rows:?}"
    );
    assert!(inner.message_ids().is_empty());
}

#[tokio::test]
async fn a_stop_lets_a_publish_in_flight_finish_within_the_grace() {
    let outbox = MemoryOutbox::new();
    outbox.enqueue(&[msg("slow")]).unwrap();
    let inner = MemoryPublisher::new();
    let handle = Relay::new(
        Arc::new(outbox.clone()),
        Arc::new(Slow {
            delay: Some(Duration::from_millis(200)),
            inner: inner.clone(),
        }),
    )
    .with_config(RelayConfig::default().stop_grace(Duration::from_secs(10)))
    .start()
    .expect("the relay starts");
    for _ in 0..100 {
        if outbox.stats().await.unwrap().held == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let all = handle.stop().await;
    assert_eq!((all.sent, all.handed_back), (1, 0), "{all:?}");
    assert_eq!(inner.message_ids(), ["slow"]);
    assert_eq!(outbox.stats().await.unwrap().sent, 1);
}

#[test]
fn the_relay_counts_published_failed_and_dead_rows() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let outbox = MemoryOutbox::new();
            outbox
                .enqueue(&[msg("ok-1"), msg("ok-2"), msg("bad")])
                .unwrap();
            let publisher = MemoryPublisher::new();
            publisher.fail("bad", None);
            let relay = Relay::new(Arc::new(outbox.clone()), Arc::new(publisher))
                .with_config(RelayConfig::default().max_attempts(1));
            let round = relay.run_once().await.unwrap();
            assert_eq!((round.sent, round.dead), (2, 1), "{round:?}");
        })
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let counter = |name: &str| -> u64 {
        snapshot
            .iter()
            .filter(|(k, ..)| k.key().name() == name)
            .map(|(.., v)| match v {
                DebugValue::Counter(n) => *n,
                _ => 0,
            })
            .sum()
    };
    assert_eq!(counter(names::OUTBOX_PUBLISHED_TOTAL), 2);
    assert_eq!(counter(names::OUTBOX_PUBLISH_FAILURES_TOTAL), 1);
    assert_eq!(counter(names::OUTBOX_DEAD_TOTAL), 1);
}

#[tokio::test]
async fn a_purger_removes_an_outboxs_sent_rows_only() {
    let clock = Arc::new(dedup_core::ManualClock::starting_now());
    let outbox = MemoryOutbox::with_clock(clock.clone());
    outbox.enqueue(&[msg("sent"), msg("dead")]).unwrap();
    let publisher = MemoryPublisher::new();
    publisher.fail("dead", None);
    Relay::new(Arc::new(outbox.clone()), Arc::new(publisher))
        .with_config(RelayConfig::default().max_attempts(1))
        .run_once()
        .await
        .unwrap();
    clock.advance(Duration::from_secs(7200));
    let purger = dedup_core::Purger::new(Duration::from_secs(3600), Duration::from_millis(10))
        .start_outbox(Arc::new(outbox.clone()))
        .unwrap();
    for _ in 0..200 {
        if outbox.stats().await.unwrap().sent == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = purger.stop().await;
    assert_eq!(stats.removed, 1, "{stats:?}");
    let left = outbox.stats().await.unwrap();
    assert_eq!((left.sent, left.dead), (0, 1), "{left:?}");
}

#[tokio::test]
async fn rounds_in_flight_keep_each_keys_order_and_publish_every_row_once() {
    let outbox = MemoryOutbox::new();
    let mut messages = Vec::new();
    for i in 0..12 {
        messages.push(
            OutboxMessage::new("orders", format!("k-{i}"), b"x".to_vec())
                .unwrap()
                .ordering_key("account-1")
                .unwrap(),
        );
        messages.push(msg(&format!("free-{i}")));
    }
    outbox.enqueue(&messages).unwrap();
    let inner = MemoryPublisher::new();
    let handle = Relay::new(
        Arc::new(outbox.clone()),
        Arc::new(Slow {
            delay: Some(Duration::from_millis(20)),
            inner: inner.clone(),
        }),
    )
    .with_config(
        RelayConfig::default()
            .batch_size(2)
            .rounds_in_flight(4)
            .poll_interval(Duration::from_millis(5)),
    )
    .start()
    .expect("the relay starts");
    for _ in 0..400 {
        if inner.message_ids().len() == 24 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    handle.stop().await;
    let published = inner.message_ids();
    let keyed: Vec<String> = published
        .iter()
        .filter(|id| id.starts_with("k-"))
        .cloned()
        .collect();
    let expected: Vec<String> = (0..12).map(|i| format!("k-{i}")).collect();
    assert_eq!(keyed, expected, "one key's rows in order, one at a time");
    assert_eq!(published.len(), 24, "every row once: {published:?}");
}

/// A publisher that claims to answer at once and never does.
#[derive(Debug)]
struct Hangs;

#[async_trait]
impl Publisher for Hangs {
    fn name(&self) -> &'static str {
        "hangs"
    }
    fn delivery_timeout(&self) -> Duration {
        Duration::ZERO
    }
    async fn publish(&self, _row: &OutboxRow) -> Result<(), BoxError> {
        std::future::pending().await
    }
}

#[tokio::test]
async fn a_relay_refuses_a_publisher_whose_delivery_timeout_outlasts_its_hold() {
    let outbox = MemoryOutbox::new();
    outbox.enqueue(&[msg("a")]).unwrap();
    let slow = Slow {
        delay: Some(Duration::from_secs(26)),
        inner: MemoryPublisher::new(),
    };
    let relay = Relay::new(Arc::new(outbox.clone()), Arc::new(slow));
    let refused = relay.clone().start().expect_err("26 s + 5 s outlasts 30 s");
    assert!(
        matches!(
            refused,
            dedup_core::Error::PublisherOutlastsHold {
                publisher: "slow",
                delivery_timeout,
                mark_margin,
                hold,
            } if delivery_timeout == Duration::from_secs(26)
                && mark_margin == Duration::from_secs(5)
                && hold == Duration::from_secs(30)
        ),
        "{refused:?}"
    );
    assert_eq!(
        refused.to_string(),
        "the slow publisher's delivery timeout (26s) plus the relay's mark margin (5s) \
         outlasts the relay's hold (30s): a row could be taken again while its first publish \
         can still land; lower the publisher's timeout or raise RelayConfig::hold"
    );
    assert!(relay.run_once().await.is_err(), "run_once checks too");
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.held), (1, 0), "nothing taken");
    // 25 s fits exactly short of the hold: refused too (the margin must stay free).
    let at_the_edge = RelayConfig::default().mark_margin(Duration::from_secs(4));
    assert!(relay.clone().with_config(at_the_edge).check().is_err());
    let fits = RelayConfig::default().mark_margin(Duration::from_millis(3999));
    relay.with_config(fits).check().unwrap();
}

#[tokio::test]
async fn a_publish_unanswered_at_the_hold_less_the_margin_counts_as_failed() {
    let outbox = MemoryOutbox::new();
    outbox.enqueue(&[msg("stuck")]).unwrap();
    let relay = Relay::new(Arc::new(outbox.clone()), Arc::new(Hangs)).with_config(
        RelayConfig::default()
            .hold(Duration::from_millis(1500))
            .mark_margin(Duration::from_millis(500)),
    );
    let started = std::time::Instant::now();
    let round = relay.run_once().await.unwrap();
    let took = started.elapsed();
    assert_eq!(
        (round.taken, round.failed, round.lost),
        (1, 1, 0),
        "{round:?}"
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(1400),
        "cut at the hold less the margin, marked within the hold: {took:?}"
    );
    let rows = outbox.list(&OutboxQuery::default()).await.unwrap();
    assert_eq!(rows[0].state, OutboxState::Pending, "{rows:?}");
    assert_eq!(rows[0].row.attempts, 1, "{rows:?}");
    let error = rows[0].last_error.as_deref().unwrap_or_default();
    assert!(error.contains("hangs publisher"), "{error}");
}
