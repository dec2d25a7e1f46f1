//! RabbitMQ killed (`kill -9`) and restarted while a consumer runs: the consumer reconnects
//! by itself and every published message is handled exactly once through a SQLite inbox.
//! While a publisher publishes: it connects again by itself, and every publish it answered
//! `Ok` is at the broker after the restart. A server that takes the connection and never
//! answers: the consumer gives each connect up and tries again, and a shutdown ends it.
//!
//! The test restarts a PRIVATE RabbitMQ, never the shared one: it uses the server of the
//! `scripts/services.sh` state dir named by `DEDUP_RESTART_SERVICES_DIR` (started with
//! `DEDUP_SERVICES_DIR=<dir> scripts/services.sh start rabbitmq`), or, without it, starts one
//! in a fresh state dir and stops it at the end (about 15 s more).

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dedup_brokers::rabbitmq::{RabbitConsumer, RabbitPublisher, Topology};
use dedup_brokers::{BrokerError, ConsumerConfig, Delivery, shutdown, with_inbox};
use dedup_core::outbox::Publisher;
use dedup_core::{Inbox, MemoryStore};
use dedup_sqlite::SqliteStore;
use lapin::options::{BasicGetOptions, ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::{Connection, ConnectionProperties};
use support::private::{Private, turn};
use support::{Runs, reached_within, row, wait_until, within};

/// How long one step of a test (a connect, a publish, a shutdown) may take before the test
/// fails naming it.
const STEP: Duration = Duration::from_secs(90);

/// A connection, tried every 200 ms for 60 s (each try given 10 s: a connect whose
/// handshake stalls is tried again, not waited for forever).
async fn connect(url: &str) -> Connection {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let attempt = Connection::connect(url, ConnectionProperties::default());
        let error = match tokio::time::timeout(Duration::from_secs(10), attempt).await {
            Ok(Ok(c)) => return c,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 10 s".to_owned(),
        };
        assert!(
            Instant::now() < deadline,
            "RabbitMQ did not come back: {error}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn publish(url: &str, queue: &str, ids: std::ops::Range<usize>) {
    let conn = connect(url).await;
    let publisher = RabbitPublisher::new(&conn).await.unwrap();
    let rows: Vec<_> = ids
        .map(|i| row(&format!("/{queue}"), &format!("m-{i}")))
        .collect();
    let results = publisher.publish_all(&rows).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    conn.close(0, "done".into()).await.unwrap();
}

/// A durable queue named `queue` (it outlives a broker restart), with its dead-letter
/// exchange and queue (`Topology::for_queue`).
///
/// Then a second's rest before anything else: RabbitMQ 3.10 answers `queue.declare-ok`
/// before its metadata store has the queue on disk, and a `kill -9` soon after can lose the
/// queue, with the persistent messages it confirmed (seen here: the queue declared about
/// 0.3 s before the kill was not among those recovered, and every publish after the restart
/// came back unroutable).
async fn declare_durable(url: &str, queue: &str) {
    let conn = connect(url).await;
    let ch = conn.create_channel().await.unwrap();
    Topology::for_queue(queue).declare(&ch).await.unwrap();
    conn.close(0, "done".into()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// The message ids `queue` holds (taken out, acked), then the queue deleted.
async fn drain_and_delete(url: &str, queue: &str) -> Vec<String> {
    let conn = connect(url).await;
    let ch = conn.create_channel().await.unwrap();
    let mut ids = Vec::new();
    while let Some(m) = ch
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        ids.push(
            m.delivery
                .properties
                .message_id()
                .as_ref()
                .unwrap()
                .to_string(),
        );
    }
    let topology = Topology::for_queue(queue);
    for q in [&topology.queue, &topology.dead_letter_queue] {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let _ = ch
        .exchange_delete(
            topology.dead_letter_exchange.as_str().into(),
            ExchangeDeleteOptions::default(),
        )
        .await;
    let _ = conn.close(0, "done".into()).await;
    ids
}

fn config() -> ConsumerConfig {
    ConsumerConfig {
        in_flight: 8,
        retry_delay: Duration::from_millis(50),
        max_retry_delay: Duration::from_millis(200),
        reconnect_delay: Duration::from_millis(100),
        max_reconnect_delay: Duration::from_secs(1),
        ..ConsumerConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_resumes_by_itself_after_rabbitmq_is_killed_and_restarted() {
    let _turn = turn().await;
    let rabbit = tokio::task::spawn_blocking(|| Private::start("rabbitmq", "DEDUP_AMQP_URL"))
        .await
        .unwrap();
    let queue = format!("dedup-restart-{}", uuid::Uuid::new_v4().simple());
    within(
        STEP,
        "declaring the queue",
        declare_durable(&rabbit.url, &queue),
    )
    .await;
    within(
        STEP,
        "publishing 0..150",
        publish(&rabbit.url, &queue, 0..150),
    )
    .await;

    let db = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(db.path().join("inbox.db")).await.unwrap();
    let runs = Runs::default();
    let handler = {
        let runs = Arc::clone(&runs);
        with_inbox(Inbox::new(store), move |_lease, d: Delivery| {
            let runs = Arc::clone(&runs);
            async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                *runs
                    .lock()
                    .unwrap()
                    .entry(d.message_id.unwrap())
                    .or_default() += 1;
                Ok::<_, std::io::Error>(Some(b"done".to_vec()))
            }
        })
    };
    let (stop, signal) = shutdown();
    let consumer = RabbitConsumer::from_uri(&rabbit.url, &queue, config());
    let task = tokio::spawn(consumer.run(handler, signal));
    wait_until("some were handled", || runs.lock().unwrap().len() >= 30).await;

    let rabbit = tokio::task::spawn_blocking(move || {
        rabbit.crash_restart("rabbitmq");
        rabbit
    })
    .await
    .unwrap();
    assert!(!task.is_finished(), "run must not end on a broker restart");
    let after = publish(&rabbit.url, &queue, 150..300);
    within(STEP, "publishing 150..300 after the restart", after).await;

    let deadline = Instant::now() + Duration::from_secs(90);
    while runs.lock().unwrap().len() < 300 {
        assert!(
            Instant::now() < deadline,
            "not all handled: {}",
            runs.lock().unwrap().len()
        );
        assert!(
            !task.is_finished(),
            "run ended before shutdown: {:?}",
            task.await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.shut_down();
    let stats = within(STEP, "the consumer's shutdown", task)
        .await
        .unwrap()
        .unwrap();
    assert!(stats.reconnects >= 1, "{stats:?}");
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 300);
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "handled more than once: {twice:?}");
    assert_eq!(stats.processed, 300, "{stats:?}");

    let left = within(
        STEP,
        "draining the queue",
        drain_and_delete(&rabbit.url, &queue),
    )
    .await;
    assert!(left.is_empty(), "every message was acked: {left:?} left");
    drop(rabbit);
}

/// One publish of the restart test and its answer.
struct Answer {
    id: String,
    answer: Result<(), String>,
    asked: Instant,
    answered: Instant,
}

impl Answer {
    /// A line for a failure message, its times relative to `restarted` (negative: before).
    fn show(&self, restarted: Instant) -> String {
        let at = |t: Instant| match t.checked_duration_since(restarted) {
            Some(after) => format!("+{:.2}s", after.as_secs_f64()),
            None => format!("-{:.2}s", (restarted - t).as_secs_f64()),
        };
        format!(
            "{} asked {} answered {}: {:?}",
            self.id,
            at(self.asked),
            at(self.answered),
            self.answer
        )
    }
}

/// Publishes one after another while RabbitMQ is killed and restarted: the publishes that
/// meet the kill return errors (their confirm never came), never `Ok`; the publisher
/// connects again by itself; every publish answered `Ok` is in the durable queue after the
/// restart (a confirm of a persistent message means it is on disk).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_reconnects_after_rabbitmq_is_killed_and_never_says_ok_unconfirmed() {
    let _turn = turn().await;
    let rabbit = tokio::task::spawn_blocking(|| Private::start("rabbitmq", "DEDUP_AMQP_URL"))
        .await
        .unwrap();
    let queue = format!("dedup-restart-pub-{}", uuid::Uuid::new_v4().simple());
    within(
        STEP,
        "declaring the queue",
        declare_durable(&rabbit.url, &queue),
    )
    .await;
    let destination = format!("/{queue}");
    let publisher = RabbitPublisher::connect(&rabbit.url, ConnectionProperties::default());
    let publisher = within(STEP, "connecting the publisher", publisher)
        .await
        .unwrap()
        .reconnect_within(Duration::from_secs(60));
    let before = row(&destination, "before");
    within(STEP, "the first publish", publisher.publish(&before))
        .await
        .unwrap();

    // One publish after another until told to stop, each answer logged: (message id,
    // answered Ok, when it was asked, when it was answered).
    let stop = Arc::new(AtomicBool::new(false));
    let confirmed = Arc::new(AtomicUsize::new(0));
    let log: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let during = tokio::spawn({
        let (publisher, destination) = (publisher.clone(), destination.clone());
        let (stop, confirmed, log) = (Arc::clone(&stop), Arc::clone(&confirmed), Arc::clone(&log));
        async move {
            for i in 0.. {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let id = format!("during-{i}");
                let asked = Instant::now();
                let answer = publisher.publish(&row(&destination, &id)).await;
                if answer.is_ok() {
                    confirmed.fetch_add(1, Ordering::SeqCst);
                }
                log.lock().unwrap().push(Answer {
                    id,
                    answer: answer.map_err(|e| e.to_string()),
                    asked,
                    answered: Instant::now(),
                });
            }
        }
    });
    wait_until("some were confirmed", || {
        confirmed.load(Ordering::SeqCst) >= 20
    })
    .await;
    let rabbit = tokio::task::spawn_blocking(move || {
        rabbit.crash_restart("rabbitmq");
        rabbit
    })
    .await
    .unwrap();
    // Publishing goes on after the restart (the broker serves AMQP again when
    // `crash_restart` returns), on a new connection: within the publisher's reconnect
    // window (60 s here). A full test run once saw no confirm for 30 s after the restart;
    // if it happens again, the panic shows what the last publishes answered, and when.
    let restarted = Instant::now();
    let at_restart = confirmed.load(Ordering::SeqCst);
    let limit = Duration::from_secs(60);
    let again = reached_within(limit, || {
        confirmed.load(Ordering::SeqCst) >= at_restart + 20
    })
    .await;
    if !again {
        // Read the log and let go of it before panicking (the task still writes it).
        let (answered, last) = {
            let log = log.lock().unwrap();
            let last: Vec<String> = log
                .iter()
                .rev()
                .take(8)
                .rev()
                .map(|a| a.show(restarted))
                .collect();
            (log.len(), last)
        };
        panic!(
            "no 20 confirms within {limit:?} after RabbitMQ was back ({} since); \
             {answered} publishes answered in all, the last ones:\n{}",
            confirmed.load(Ordering::SeqCst) - at_restart,
            last.join("\n")
        );
    }
    stop.store(true, Ordering::SeqCst);
    within(STEP, "the publishing task's end", during)
        .await
        .unwrap();
    let answers = std::mem::take(&mut *log.lock().unwrap());
    let failed: Vec<_> = answers
        .iter()
        .filter_map(|a| a.answer.as_ref().err().map(|e| (&a.id, e)))
        .collect();
    assert!(
        !failed.is_empty(),
        "the publish the kill met must fail, not hang or say Ok"
    );
    for i in 0..3 {
        let row = row(&destination, &format!("after-{i}"));
        within(STEP, "a publish after the restart", publisher.publish(&row))
            .await
            .unwrap_or_else(|e| panic!("publish {i} after the restart failed: {e}"));
    }
    let batch = [row(&destination, "batch-0"), row(&destination, "batch-1")];
    let results = within(
        STEP,
        "a batch after the restart",
        publisher.publish_all(&batch),
    )
    .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");

    let held = within(
        STEP,
        "draining the queue",
        drain_and_delete(&rabbit.url, &queue),
    )
    .await;
    let lost: Vec<_> = answers
        .iter()
        .filter(|a| a.answer.is_ok())
        .map(|a| a.id.as_str())
        .chain([
            "before", "after-0", "after-1", "after-2", "batch-0", "batch-1",
        ])
        .filter(|id| !held.iter().any(|h| h == id))
        .collect();
    assert!(
        lost.is_empty(),
        "answered Ok but not at the broker: {lost:?} ({} failed: {failed:?})",
        failed.len()
    );
    drop(rabbit);
}

/// A server that takes the TCP connection and never says a word of AMQP (a broker stuck in
/// its boot, a proxy whose upstream is gone): each connect is given up after
/// `connect_timeout` and tried again, and a shutdown ends the run at once.
#[tokio::test]
async fn a_server_that_never_answers_the_handshake_is_tried_again_not_waited_for() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let silent = tokio::spawn({
        let accepted = Arc::clone(&accepted);
        async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                held.push(socket);
            }
        }
    });
    let config = ConsumerConfig {
        connect_timeout: Duration::from_millis(200),
        reconnect_delay: Duration::from_millis(50),
        max_reconnect_delay: Duration::from_millis(50),
        ..config()
    };
    let url = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
    let consumer = RabbitConsumer::from_uri(url, "any", config);
    let health = consumer.health();
    let handler = with_inbox(
        Inbox::new(MemoryStore::new()),
        |_lease, _d: Delivery| async { Ok::<_, std::io::Error>(None) },
    );
    let (stop, signal) = shutdown();
    let task = tokio::spawn(consumer.run(handler, signal));
    wait_until("three connects", || accepted.load(Ordering::SeqCst) >= 3).await;
    assert!(
        !task.is_finished(),
        "a silent server is retried, not an error"
    );
    assert!(!health.snapshot().connected);
    stop.shut_down();
    let ended = within(Duration::from_secs(5), "the run after the shutdown", task).await;
    let stats = ended.unwrap().unwrap();
    assert_eq!(stats.processed, 0, "{stats:?}");
    silent.abort();
}

#[tokio::test]
async fn refused_credentials_end_run_with_a_refused_error_at_once() {
    let Some(url) = dedup_conformance::server_url("DEDUP_AMQP_URL") else {
        return;
    };
    // Same server, a user that does not exist.
    let (_, rest) = url.split_once('@').expect("a URL with credentials");
    let bad = format!(
        "amqp://nobody-{}:wrong@{rest}",
        uuid::Uuid::new_v4().simple()
    );
    let started = Instant::now();
    let (_stop, signal) = shutdown();
    let handler = with_inbox(
        Inbox::new(MemoryStore::new()),
        |_lease, _d: Delivery| async { Ok::<_, std::io::Error>(None) },
    );
    let run = RabbitConsumer::from_uri(bad, "any", config()).run(handler, signal);
    let result = within(STEP, "a run with refused credentials", run).await;
    assert!(
        matches!(result, Err(BrokerError::Refused { .. })),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10), "no retry loop");

    // A queue that does not exist: no reconnect makes it.
    let (_stop, signal) = shutdown();
    let handler = with_inbox(
        Inbox::new(MemoryStore::new()),
        |_lease, _d: Delivery| async { Ok::<_, std::io::Error>(None) },
    );
    let missing = format!("no-such-queue-{}", uuid::Uuid::new_v4().simple());
    let run = RabbitConsumer::from_uri(url, missing, config()).run(handler, signal);
    let result = within(STEP, "a run on a missing queue", run).await;
    assert!(
        matches!(result, Err(BrokerError::Refused { .. })),
        "{result:?}"
    );
}
