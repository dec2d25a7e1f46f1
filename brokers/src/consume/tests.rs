//! The loop against a source that stalls: a connect or a stop that never answers must
//! not stall the consumer or its shutdown.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::{Handled, InboxError, Key};

use super::consume;
use crate::{Action, BrokerError, ConsumerConfig, Delivery, Pending, Shutdown, Source, shutdown};

/// Where a [`Stalling`] source stops answering.
#[derive(Clone, Copy)]
enum Stall {
    /// Every connect waits forever.
    Connect,
    /// Connects at once, delivers nothing; its `stop` and `give_back` wait forever.
    Stop,
}

/// A source that stops answering at one step, counting its connects.
struct Stalling {
    stall: Stall,
    connects: Arc<AtomicUsize>,
}

/// No delivery ever exists.
enum Nothing {}

#[async_trait]
impl Pending for Nothing {
    fn delivery(&self) -> &Delivery {
        match *self {}
    }

    async fn settle(self, _action: Action, _shutdown: &Shutdown) -> Result<(), BrokerError> {
        match self {}
    }
}

#[async_trait]
impl Source for Stalling {
    type Pending = Nothing;

    fn endpoint(&self) -> &str {
        "stalling"
    }

    async fn connect(&mut self, _config: &ConsumerConfig) -> Result<(), BrokerError> {
        self.connects.fetch_add(1, Ordering::SeqCst);
        match self.stall {
            Stall::Connect => std::future::pending().await,
            Stall::Stop => Ok(()),
        }
    }

    async fn fetch(
        &mut self,
        _max: usize,
        shutdown: &Shutdown,
    ) -> Result<Vec<Nothing>, BrokerError> {
        shutdown.wait().await;
        Ok(Vec::new())
    }

    async fn stop(&mut self) {
        std::future::pending::<()>().await;
    }

    async fn give_back(&mut self) {
        std::future::pending::<()>().await;
    }
}

async fn never_called(_key: Key, _delivery: Delivery) -> Result<Handled, InboxError> {
    unreachable!("the stalling source delivers nothing")
}

fn config(connect_timeout: Duration) -> ConsumerConfig {
    ConsumerConfig {
        reconnect_delay: Duration::from_millis(20),
        max_reconnect_delay: Duration::from_millis(20),
        connect_timeout,
        ..ConsumerConfig::default()
    }
}

/// Runs the loop over a [`Stalling`] source until `until` holds of its connects, then shuts
/// it down: what `consume` returned (it must return within 5 s of the shutdown), and the
/// connects seen.
async fn run_then_shut_down(
    stall: Stall,
    connect_timeout: Duration,
    until: impl Fn(usize) -> bool,
) -> (Result<crate::ConsumerStats, BrokerError>, usize) {
    let connects = Arc::new(AtomicUsize::new(0));
    let source = Stalling {
        stall,
        connects: Arc::clone(&connects),
    };
    let (trigger, signal) = shutdown();
    let task = tokio::spawn(consume(
        source,
        config(connect_timeout),
        never_called,
        signal,
    ));
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while !until(connects.load(Ordering::SeqCst)) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "connects seen: {}",
        connects.load(Ordering::SeqCst)
    );
    trigger.shut_down();
    let ended = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("run did not end within 5 s of the shutdown")
        .unwrap();
    (ended, connects.load(Ordering::SeqCst))
}

#[tokio::test]
async fn a_connect_that_never_answers_is_given_up_and_tried_again() {
    let (ended, connects) =
        run_then_shut_down(Stall::Connect, Duration::from_millis(50), |n| n >= 3).await;
    assert!(connects >= 3, "{connects}");
    assert_eq!(ended.unwrap().processed, 0);
}

#[tokio::test]
async fn a_shutdown_ends_a_connect_that_never_answers() {
    // The connect's own limit (an hour) is never reached: the shutdown ends it.
    let (ended, connects) =
        run_then_shut_down(Stall::Connect, Duration::from_secs(3600), |n| n == 1).await;
    assert_eq!(connects, 1);
    assert!(ended.is_ok(), "{ended:?}");
}

#[tokio::test]
async fn a_stop_that_never_answers_is_given_up_at_shutdown() {
    // `stop` and `give_back` each wait their 100 ms, then the run ends.
    let (ended, connects) =
        run_then_shut_down(Stall::Stop, Duration::from_millis(100), |n| n == 1).await;
    assert_eq!(connects, 1);
    assert!(ended.is_ok(), "{ended:?}");
}

#[test]
fn a_zero_connect_timeout_is_refused() {
    let err = config(Duration::ZERO).check().unwrap_err();
    assert!(err.to_string().contains("connect_timeout"), "{err}");
}
