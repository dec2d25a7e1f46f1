//! Helpers the broker tests share.
#![allow(dead_code)] // each test file uses a part

#[cfg(feature = "kafka")]
pub mod kafka;
pub mod private;
pub mod relay_time;
pub mod replay;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use dedup_brokers::{ConsumerConfig, ConsumerStats, Delivery, Handle, with_inbox};
use dedup_core::outbox::OutboxRow;
use dedup_core::trace::{
    CAUSATION_ID_HEADER, CORRELATION_ID_HEADER, TRACEPARENT_HEADER, TraceParent,
};
use dedup_core::{
    DedupStore, Handled, HandlerRetry, Inbox, InboxConfig, InboxError, Key, MemoryStore, Timestamp,
    Transient,
};

/// Handler runs per message id.
pub type Runs = Arc<Mutex<HashMap<String, u32>>>;

pub fn row(destination: &str, id: &str) -> OutboxRow {
    OutboxRow {
        id: 1,
        destination: destination.into(),
        message_id: id.into(),
        headers: vec![
            ("tenant".into(), "acme".into()),
            (CORRELATION_ID_HEADER.into(), format!("corr-{id}")),
            (CAUSATION_ID_HEADER.into(), format!("cause-{id}")),
            (
                TRACEPARENT_HEADER.into(),
                TraceParent::derived(&format!("corr-{id}"), id).to_string(),
            ),
        ],
        payload: format!("payload of {id}").into_bytes(),
        ordering_key: None,
        written_at: Timestamp::from_system_time(SystemTime::now()),
        attempts: 1,
    }
}

pub fn config() -> ConsumerConfig {
    ConsumerConfig {
        in_flight: 4,
        retry_delay: Duration::from_millis(50),
        max_retry_delay: Duration::from_millis(200),
        ..ConsumerConfig::default()
    }
}

/// A lease-mode handler over `store` that counts its runs in `runs` (after `sleep`) and
/// every settled answer (duplicates included; not `Busy`, not errors) in `calls`.
pub fn counting(
    store: &Arc<MemoryStore>,
    config: InboxConfig,
    runs: &Runs,
    calls: &Arc<AtomicU32>,
    sleep: Duration,
) -> impl Handle + use<> {
    let runs = Arc::clone(runs);
    let calls = Arc::clone(calls);
    let inner = Arc::new(with_inbox(
        Inbox::from_arc(Arc::clone(store), config),
        move |_lease, d: Delivery| {
            let runs = Arc::clone(&runs);
            async move {
                tokio::time::sleep(sleep).await;
                *runs
                    .lock()
                    .unwrap()
                    .entry(d.message_id.unwrap())
                    .or_default() += 1;
                Ok::<_, std::io::Error>(Some(b"done".to_vec()))
            }
        },
    ));
    move |key: Key, d: Delivery| {
        let inner = Arc::clone(&inner);
        let calls = Arc::clone(&calls);
        async move {
            let answer = inner.handle(&key, &d).await;
            if answer.as_ref().is_ok_and(Handled::is_settled) {
                calls.fetch_add(1, Ordering::SeqCst);
            }
            answer
        }
    }
}

/// A handler that processes (commits) and then hangs forever before returning: its
/// consumer never acks, as if killed right after the commit. `committed` counts commits.
pub fn commit_then_hang(
    store: &Arc<MemoryStore>,
    runs: &Runs,
    committed: &Arc<AtomicU32>,
) -> impl Handle + use<> {
    let inner = Arc::new(counting(
        store,
        InboxConfig::default(),
        runs,
        &Arc::new(AtomicU32::new(0)),
        Duration::ZERO,
    ));
    let committed = Arc::clone(committed);
    move |key: Key, d: Delivery| {
        let inner = Arc::clone(&inner);
        let committed = Arc::clone(&committed);
        async move {
            let answer: Result<Handled, InboxError> = inner.handle(&key, &d).await;
            assert!(
                matches!(answer, Ok(Handled::Processed { .. })),
                "{answer:?}"
            );
            committed.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
            answer
        }
    }
}

/// A handler that always fails, under an inbox allowing `max_attempts`; counts its runs.
pub fn poison<S: DedupStore + 'static>(
    store: S,
    max_attempts: u32,
    runs: &Arc<AtomicU32>,
) -> impl Handle + use<S> {
    let inbox = Inbox::new(store).with_config(InboxConfig {
        max_attempts: Some(max_attempts),
        ..InboxConfig::default()
    });
    let runs = Arc::clone(runs);
    with_inbox(inbox, move |_lease, _d: Delivery| {
        runs.fetch_add(1, Ordering::SeqCst);
        async { Err::<Option<Vec<u8>>, _>("cannot parse") }
    })
}

/// One run of the [`transient_once`] handler: the lease's attempt, and whether the broker
/// said the delivery was a redelivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransientRun {
    pub attempt: u32,
    pub redelivered: bool,
}

/// A handler built with `with_inbox` (an inbox over `store` with one in-process retry)
/// whose work fails `Transient` on its first run of each message and succeeds on the next;
/// every run is logged in `log`.
pub fn transient_once(
    store: &Arc<MemoryStore>,
    log: &Arc<Mutex<Vec<TransientRun>>>,
) -> impl Handle + use<> {
    let inbox = Inbox::from_arc(
        Arc::clone(store),
        InboxConfig {
            handler_retry: HandlerRetry::immediate(1),
            ..InboxConfig::default()
        },
    );
    let log = Arc::clone(log);
    with_inbox(inbox, move |lease, d: Delivery| {
        let log = Arc::clone(&log);
        async move {
            log.lock().unwrap().push(TransientRun {
                attempt: lease.attempt,
                redelivered: d.redelivered,
            });
            if lease.attempt == 1 {
                let timeout =
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "courier timed out");
                return Err(Transient::new(timeout));
            }
            Ok(Some(b"booked".to_vec()))
        }
    })
}

/// What [`transient_once`] must show after one message: two runs inside the first delivery
/// (attempts 1 and 2, neither a redelivery), settled as processed, no error.
pub fn assert_retried_in_process(stats: &ConsumerStats, log: &Mutex<Vec<TransientRun>>) {
    let first = |attempt| TransientRun {
        attempt,
        redelivered: false,
    };
    assert_eq!(*log.lock().unwrap(), [first(1), first(2)], "{stats:?}");
    assert_eq!(
        (stats.processed, stats.errors, stats.duplicates, stats.busy),
        (1, 0, 0, 0),
        "{stats:?}"
    );
}

pub async fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    let limit = Duration::from_secs(10);
    assert!(
        reached_within(limit, cond).await,
        "timed out waiting {limit:?} until {what}"
    );
}

/// `step`'s output, or a panic naming `what` when it takes longer than `limit`: a step that
/// hangs fails its test with the step's name instead of stalling the whole run.
pub async fn within<T>(limit: Duration, what: &str, step: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, step).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: not done within {limit:?}"),
    }
}

/// Whether `cond` held within `limit` (checked every 25 ms), for a caller that explains a
/// timeout itself.
pub async fn reached_within(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let started = std::time::Instant::now();
    while started.elapsed() < limit {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

pub fn all_once(runs: &Runs, n: usize) -> bool {
    let runs = runs.lock().unwrap();
    runs.len() == n && runs.values().all(|r| *r == 1)
}

/// A handler (under a lease-mode inbox over a fresh store) that records the message ids in
/// the order it starts them in `order`, and the most runs it ever saw at once in `most`.
pub fn one_at_a_time_probe(
    order: &Arc<Mutex<Vec<String>>>,
    most: &Arc<AtomicU32>,
) -> impl Handle + use<> {
    let (order, most) = (Arc::clone(order), Arc::clone(most));
    let running = Arc::new(AtomicU32::new(0));
    with_inbox(
        Inbox::new(MemoryStore::new()),
        move |_lease, d: Delivery| {
            let (order, most, running) =
                (Arc::clone(&order), Arc::clone(&most), Arc::clone(&running));
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                order.lock().unwrap().push(d.message_id.unwrap());
                tokio::time::sleep(Duration::from_millis(5)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(Some(b"done".to_vec()))
            }
        },
    )
}

/// `m-0` .. `m-{n-1}`.
pub fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("m-{i}")).collect()
}

/// [`config`] with at most one message in flight.
pub fn one_in_flight() -> ConsumerConfig {
    ConsumerConfig {
        in_flight: 1,
        ..config()
    }
}

/// What a run of [`one_at_a_time_probe`] over `ids(n)` must show: every message processed,
/// in publish order, never two at once.
pub fn assert_one_at_a_time(
    stats: &ConsumerStats,
    order: &Mutex<Vec<String>>,
    most: &AtomicU32,
    n: usize,
) {
    assert_eq!(stats.processed as usize, n, "{stats:?}");
    assert_eq!(*order.lock().unwrap(), ids(n));
    assert_eq!(most.load(Ordering::SeqCst), 1, "never two at once");
}
