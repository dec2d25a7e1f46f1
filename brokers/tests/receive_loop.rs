//! The receive loop ([`consume`]) over a scripted source, no broker needed: what it
//! connects, fetches, settles and counts, how it waits between connects, and how it stops.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use dedup_brokers::{
    Action, BrokerError, ConsumerConfig, ConsumerStats, Delivery, Health, Pending, Shutdown,
    Source, consume, consume_with_health, refusal, shutdown, with_inbox,
};
use dedup_core::{BoxError, Inbox, MemoryStore};

/// What the scripted source saw and did, in order.
#[derive(Debug, Default)]
struct Log {
    /// `connect`, `fetch N` (N asked), `stop`, `give_back`.
    steps: Mutex<Vec<String>>,
    /// When each connect began.
    connects: Mutex<Vec<Instant>>,
    /// Each settled delivery's broker reference and action.
    settled: Mutex<Vec<(String, Action)>>,
}

impl Log {
    fn step(&self, step: String) {
        self.steps.lock().unwrap().push(step);
    }

    fn steps(&self) -> Vec<String> {
        self.steps.lock().unwrap().clone()
    }

    fn connects(&self) -> Vec<Instant> {
        self.connects.lock().unwrap().clone()
    }

    fn settled(&self) -> Vec<(String, Action)> {
        self.settled.lock().unwrap().clone()
    }
}

/// A source answering each connect and fetch with the next planned answer. Past the
/// plan, a connect succeeds and a fetch waits for the shutdown and returns nothing.
struct Scripted {
    connects: VecDeque<Result<(), BrokerError>>,
    fetches: VecDeque<Result<Vec<Delivery>, BrokerError>>,
    log: Arc<Log>,
}

struct Fetched {
    delivery: Delivery,
    log: Arc<Log>,
}

#[async_trait]
impl Pending for Fetched {
    fn delivery(&self) -> &Delivery {
        &self.delivery
    }

    async fn settle(self, action: Action, _shutdown: &Shutdown) -> Result<(), BrokerError> {
        let settled = (self.delivery.broker_ref.clone(), action);
        self.log.settled.lock().unwrap().push(settled);
        Ok(())
    }
}

#[async_trait]
impl Source for Scripted {
    type Pending = Fetched;

    fn endpoint(&self) -> &str {
        "scripted"
    }

    async fn connect(&mut self, _config: &ConsumerConfig) -> Result<(), BrokerError> {
        self.log.connects.lock().unwrap().push(Instant::now());
        self.log.step("connect".into());
        self.connects.pop_front().unwrap_or(Ok(()))
    }

    async fn fetch(
        &mut self,
        max: usize,
        shutdown: &Shutdown,
    ) -> Result<Vec<Fetched>, BrokerError> {
        self.log.step(format!("fetch {max}"));
        let Some(answer) = self.fetches.pop_front() else {
            shutdown.wait().await;
            return Ok(Vec::new());
        };
        let fetched = |delivery| Fetched {
            delivery,
            log: Arc::clone(&self.log),
        };
        answer.map(|deliveries| deliveries.into_iter().map(fetched).collect())
    }

    async fn stop(&mut self) {
        self.log.step("stop".into());
    }

    async fn give_back(&mut self) {
        self.log.step("give_back".into());
    }
}

fn scripted(
    connects: Vec<Result<(), BrokerError>>,
    fetches: Vec<Result<Vec<Delivery>, BrokerError>>,
) -> (Scripted, Arc<Log>) {
    let log = Arc::new(Log::default());
    let source = Scripted {
        connects: connects.into(),
        fetches: fetches.into(),
        log: Arc::clone(&log),
    };
    (source, log)
}

/// A delivery with `id` as its message id and its broker reference (`None`: no id,
/// reference `no-id`).
fn delivery(id: Option<&str>) -> Delivery {
    Delivery {
        message_id: id.map(str::to_owned),
        payload: bytes::Bytes::from_static(b"{}"),
        headers: Vec::new(),
        published_at: None,
        redelivered: false,
        broker_ref: id.unwrap_or("no-id").to_owned(),
    }
}

fn lost() -> BrokerError {
    BrokerError::Broker {
        context: "reading".into(),
        source: "connection reset".into(),
    }
}

fn refused() -> BrokerError {
    BrokerError::Refused {
        context: "subscribing".into(),
        source: "access refused".into(),
    }
}

fn config() -> ConsumerConfig {
    ConsumerConfig {
        reconnect_delay: Duration::from_millis(10),
        max_reconnect_delay: Duration::from_millis(10),
        connect_timeout: Duration::from_secs(5),
        ..ConsumerConfig::default()
    }
}

/// Runs the loop over `source` with an inbox over a fresh store whose handler sleeps
/// `work` and stores the payload, until `until` holds of the log (then shuts it down) or
/// the loop ends by itself. What `consume_with_health` returned (it must end within 10 s).
async fn run(
    source: Scripted,
    config: ConsumerConfig,
    health: Health,
    work: Duration,
    until: impl Fn(&Log) -> bool,
) -> Result<ConsumerStats, BrokerError> {
    let log = Arc::clone(&source.log);
    let handler = with_inbox(
        Inbox::new(MemoryStore::new()),
        move |_lease, delivery: Delivery| async move {
            tokio::time::sleep(work).await;
            Ok::<_, BoxError>(Some(delivery.payload.to_vec()))
        },
    );
    let (trigger, signal) = shutdown();
    let mut task = tokio::spawn(consume_with_health(source, config, handler, signal, health));
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if until(&log) {
                trigger.shut_down();
                return (&mut task).await.unwrap();
            }
            if task.is_finished() {
                return (&mut task).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    ended.expect("the loop did not end within 10 s")
}

#[tokio::test]
async fn each_delivery_is_handled_settled_and_counted_then_the_source_stopped() {
    let first = vec![delivery(Some("m-1")), delivery(Some("m-2")), delivery(None)];
    let (source, log) = scripted(vec![], vec![Ok(first), Ok(vec![delivery(Some("m-1"))])]);
    let health = Health::default();
    // One at a time: the copy of m-1 comes after the first is done, so it is a duplicate.
    let config = ConsumerConfig {
        in_flight: 1,
        ..config()
    };
    let four_settled = |log: &Log| log.settled().len() == 4;
    let stats = run(source, config, health.clone(), Duration::ZERO, four_settled).await;
    let stats = stats.unwrap();
    let counts = (stats.processed, stats.duplicates, stats.refused);
    assert_eq!(counts, (2, 1, 1), "{stats:?}");
    let settled = log.settled();
    assert_eq!(settled.iter().filter(|(_, a)| *a == Action::Ack).count(), 3);
    let no_id = settled.iter().find(|(r, _)| r == "no-id").unwrap();
    assert!(
        matches!(&no_id.1, Action::DeadLetter { reason, .. } if reason == "no message id"),
        "{no_id:?}"
    );
    // One connect, each fetch asking for the one slot, then the shutdown's two steps.
    let steps = log.steps();
    assert_eq!(
        steps,
        [
            "connect",
            "fetch 1",
            "fetch 1",
            "fetch 1",
            "stop",
            "give_back"
        ]
    );
    let snapshot = health.snapshot();
    assert!(snapshot.last_settle.is_some(), "{snapshot:?}");
    assert_eq!((snapshot.connected, snapshot.in_flight), (false, 0));
}

#[tokio::test]
async fn consume_counts_as_consume_with_health_does() {
    let (source, log) = scripted(vec![], vec![Ok(vec![delivery(Some("m-1"))])]);
    let handler = with_inbox(Inbox::new(MemoryStore::new()), |_lease, _d| async {
        Ok::<_, BoxError>(None)
    });
    let (trigger, signal) = shutdown();
    let task = tokio::spawn(consume(source, config(), handler, signal));
    tokio::time::timeout(Duration::from_secs(10), async {
        while log.settled().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("settled within 10 s");
    trigger.shut_down();
    let stats = tokio::time::timeout(Duration::from_secs(10), task).await;
    let stats = stats.expect("ended").unwrap().unwrap();
    assert_eq!(stats.processed, 1, "{stats:?}");
}

#[tokio::test]
async fn a_lost_connection_connects_again_and_a_refusal_ends_the_run_after_the_handlers() {
    let fetches = vec![Err(lost()), Ok(vec![delivery(Some("m-1"))]), Err(refused())];
    let (source, log) = scripted(vec![], fetches);
    let health = Health::default();
    // The handler is still running when the refusal comes: the run waits for it.
    let work = Duration::from_millis(100);
    let ended = run(source, config(), health.clone(), work, |_| false).await;
    assert!(
        matches!(ended, Err(BrokerError::Refused { .. })),
        "{ended:?}"
    );
    assert_eq!(log.settled(), [("m-1".to_owned(), Action::Ack)]);
    // The third fetch asks for the 15 slots m-1 left free. Stopped, but nothing given
    // back: the broker redelivers what it holds itself.
    let steps = log.steps();
    assert_eq!(
        steps,
        [
            "connect", "fetch 16", "connect", "fetch 16", "fetch 15", "stop"
        ]
    );
    assert_eq!(health.snapshot().reconnects, 1);
}

#[tokio::test]
async fn a_failed_connect_is_tried_again_after_a_doubling_delay() {
    let (source, log) = scripted(vec![Err(lost()), Err(lost()), Err(lost())], vec![]);
    let config = ConsumerConfig {
        reconnect_delay: Duration::from_millis(40),
        max_reconnect_delay: Duration::from_secs(1),
        ..config()
    };
    let four = |log: &Log| log.connects().len() == 4;
    let ended = run(source, config, Health::default(), Duration::ZERO, four).await;
    assert!(ended.is_ok(), "{ended:?}");
    let connects = log.connects();
    let gaps: Vec<_> = connects.windows(2).map(|w| w[1] - w[0]).collect();
    for (gap, least) in gaps.iter().zip([40, 80, 160]) {
        assert!(*gap >= Duration::from_millis(least), "{gaps:?}");
    }
}

#[tokio::test]
async fn a_shutdown_ends_the_wait_before_connecting_again() {
    let (source, log) = scripted(vec![Err(lost())], vec![]);
    let config = ConsumerConfig {
        reconnect_delay: Duration::from_secs(3600),
        max_reconnect_delay: Duration::from_secs(3600),
        ..config()
    };
    let started = Instant::now();
    // Shut down 200 ms in: the loop is still waiting its hour, having connected once.
    let waited = |_: &Log| started.elapsed() >= Duration::from_millis(200);
    let ended = run(source, config, Health::default(), Duration::ZERO, waited).await;
    assert!(ended.is_ok(), "{ended:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "ended early"
    );
    assert_eq!(log.steps(), ["connect"]);
}

#[tokio::test]
async fn a_refused_connect_ends_the_run_at_once() {
    let (source, log) = scripted(vec![Err(refused())], vec![]);
    let ended = run(source, config(), Health::default(), Duration::ZERO, |_| {
        false
    })
    .await;
    assert!(
        matches!(ended, Err(BrokerError::Refused { .. })),
        "{ended:?}"
    );
    assert_eq!(log.steps(), ["connect"]);
}

#[tokio::test]
async fn handlers_run_side_by_side_up_to_in_flight() {
    // The source hands over three when asked for two: the third waits for a free slot.
    let batch = vec![
        delivery(Some("a")),
        delivery(Some("b")),
        delivery(Some("c")),
    ];
    let (source, log) = scripted(vec![], vec![Ok(batch)]);
    let config = ConsumerConfig {
        in_flight: 2,
        ..config()
    };
    let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let handler = {
        let (running, most) = (Arc::clone(&running), Arc::clone(&most));
        with_inbox(Inbox::new(MemoryStore::new()), move |_lease, _d| {
            let (running, most) = (Arc::clone(&running), Arc::clone(&most));
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, BoxError>(None)
            }
        })
    };
    let (trigger, signal) = shutdown();
    let task = tokio::spawn(consume(source, config, handler, signal));
    tokio::time::timeout(Duration::from_secs(10), async {
        while log.settled().len() < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("three settled within 10 s");
    trigger.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_eq!(stats.processed, 3);
    assert_eq!(most.load(Ordering::SeqCst), 2, "two at once, never three");
    assert_eq!(log.steps()[1], "fetch 2");
}

#[test]
fn a_delivery_as_old_as_the_admission_floor_is_admitted_and_an_older_one_refused() {
    let floor = |max_age| ConsumerConfig {
        max_age: Some(max_age),
        ..ConsumerConfig::default()
    };
    let published = |at| Delivery {
        published_at: Some(at),
        ..delivery(Some("m-1"))
    };
    // A clock ahead of ours: an age of zero, not over a floor of zero.
    let ahead = published(SystemTime::now() + Duration::from_secs(60));
    assert!(refusal("billing", &ahead, &floor(Duration::ZERO)).is_ok());
    let now = published(SystemTime::now());
    assert!(refusal("billing", &now, &floor(Duration::from_secs(3600))).is_ok());
    let old = published(SystemTime::now() - Duration::from_secs(7200));
    let refused = refusal("billing", &old, &floor(Duration::from_secs(3600))).unwrap_err();
    assert!(
        refused.contains("older than the admission floor"),
        "{refused}"
    );
}
