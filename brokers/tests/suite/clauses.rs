//! The clauses: each takes a fresh endpoint and panics when the broker's consumer breaks
//! the rule it is named for.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dedup_brokers::{
    ConsumerConfig, Delivery, FAILURE_ATTEMPTS_HEADER, FAILURE_CONSUMER_HEADER,
    FAILURE_KIND_HEADER, FAILURE_MESSAGE_HEADER, FAILURE_TIME_HEADER, Shutdown, consume, shutdown,
    with_inbox,
};
use dedup_core::trace::{MessageTrace, TraceParent};
use dedup_core::{Inbox, InboxConfig, MemoryStore};

use super::BrokerFactory;
use crate::support::{
    Runs, all_once, assert_one_at_a_time, commit_then_hang, config, counting, ids,
    one_at_a_time_probe, one_in_flight, poison, wait_until,
};

async fn dead_letters_at_least<F: BrokerFactory>(fx: &F, n: usize) -> Vec<super::DeadLetter> {
    for _ in 0..400 {
        let dead = fx.dead_letters().await;
        if dead.len() >= n {
            return dead;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("fewer than {n} dead letters");
}

fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

/// `a b a a c` published (each copy kept by the broker): a, b and c handled once each, the
/// copies acked as duplicates, nothing left.
pub async fn same_id_published_n_times_is_handled_once<F: BrokerFactory>(fx: F) {
    fx.publish(&strings(&["a", "b", "a", "a", "c"])).await;
    let (runs, calls) = (Runs::default(), Arc::new(AtomicU32::new(0)));
    let store = Arc::new(MemoryStore::new());
    let handler = counting(
        &store,
        InboxConfig::default(),
        &runs,
        &calls,
        Duration::ZERO,
    );
    let (stop, signal) = shutdown();
    let cfg = config();
    let task = tokio::spawn(consume(fx.source("w1", &cfg).await, cfg, handler, signal));
    // At least five: a redelivery on top of the five copies shows in the stats below.
    wait_until("five settled", || calls.load(Ordering::SeqCst) >= 5).await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_eq!((stats.processed, stats.duplicates), (3, 2), "{stats:?}");
    assert!(all_once(&runs, 3), "a, b and c ran once each: {runs:?}");
    assert_eq!(fx.outstanding().await, 0, "every delivery was settled");
    fx.cleanup().await;
}

/// A message without an id: at the dead letters with the reason, the handler never runs.
pub async fn a_delivery_without_an_id_is_dead_lettered_never_handled<F: BrokerFactory>(fx: F) {
    fx.publish_without_id(b"no id").await;
    let (runs, calls) = (Runs::default(), Arc::new(AtomicU32::new(0)));
    let handler = counting(
        &Arc::new(MemoryStore::new()),
        InboxConfig::default(),
        &runs,
        &calls,
        Duration::ZERO,
    );
    let (stop, signal) = shutdown();
    let cfg = config();
    let task = tokio::spawn(consume(fx.source("w1", &cfg).await, cfg, handler, signal));
    let dead = dead_letters_at_least(&fx, 1).await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].payload, b"no id");
    assert_eq!(dead[0].reason.as_deref(), Some("no message id"));
    assert_eq!(stats.refused, 1, "{stats:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the handler never saw it");
    assert!(runs.lock().unwrap().is_empty());
    assert_eq!(fx.outstanding().await, 0);
    fx.cleanup().await;
}

/// Worker A commits and hangs before its ack, then is killed: worker B gets the
/// redelivery, the inbox answers it as a duplicate, the effect happened once.
pub async fn a_consumer_killed_mid_handler_has_its_redelivery_absorbed<F: BrokerFactory>(fx: F) {
    fx.publish(&strings(&["order-1"])).await;
    let store = Arc::new(MemoryStore::new());
    let runs = Runs::default();
    let committed = Arc::new(AtomicU32::new(0));
    let cfg = config();
    let a = consume(
        fx.source("w-a", &cfg).await,
        cfg.clone(),
        commit_then_hang(&store, &runs, &committed),
        Shutdown::never(),
    );
    let task_a = tokio::spawn(a);
    wait_until("A committed", || committed.load(Ordering::SeqCst) == 1).await;
    task_a.abort();
    let _ = task_a.await;
    fx.kill("w-a").await;

    let calls = Arc::new(AtomicU32::new(0));
    let handler = counting(
        &store,
        InboxConfig::default(),
        &runs,
        &calls,
        Duration::ZERO,
    );
    let (stop, signal) = shutdown();
    let task_b = tokio::spawn(consume(fx.source("w-b", &cfg).await, cfg, handler, signal));
    wait_until("B got the redelivery", || calls.load(Ordering::SeqCst) == 1).await;
    stop.shut_down();
    let stats = task_b.await.unwrap().unwrap();
    assert_eq!((stats.processed, stats.duplicates), (0, 1), "{stats:?}");
    assert!(all_once(&runs, 1), "the handler ran once: {runs:?}");
    assert_eq!(fx.outstanding().await, 0);
    fx.cleanup().await;
}

/// 30 messages, at most 3 in flight: never more than 3 handlers at once (counted), and the
/// bound is used (3 at once at some point), every message handled once.
pub async fn the_in_flight_bound_is_never_exceeded<F: BrokerFactory>(fx: F) {
    fx.publish(&ids(30)).await;
    let (running, most) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let runs = Runs::default();
    let handler = {
        let (running, most, runs) = (Arc::clone(&running), Arc::clone(&most), Arc::clone(&runs));
        with_inbox(
            Inbox::new(MemoryStore::new()),
            move |_lease, d: Delivery| {
                let (running, most, runs) =
                    (Arc::clone(&running), Arc::clone(&most), Arc::clone(&runs));
                async move {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(40)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    *runs
                        .lock()
                        .unwrap()
                        .entry(d.message_id.unwrap())
                        .or_default() += 1;
                    Ok::<_, std::io::Error>(None)
                }
            },
        )
    };
    let cfg = ConsumerConfig {
        in_flight: 3,
        ..config()
    };
    let (stop, signal) = shutdown();
    let task = tokio::spawn(consume(fx.source("w1", &cfg).await, cfg, handler, signal));
    wait_until("all ran", || runs.lock().unwrap().len() == 30).await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 3, "{most} handlers ran at once with in_flight 3");
    assert_eq!(most, 3, "the bound was never reached: {most}");
    assert_eq!(stats.processed, 30, "{stats:?}");
    assert!(all_once(&runs, 30));
    assert_eq!(fx.outstanding().await, 0);
    fx.cleanup().await;
}

/// Shutdown with handlers running: what was started settles, nothing is lost; a second
/// consumer handles the rest, each message once.
pub async fn shutdown_settles_every_started_delivery<F: BrokerFactory>(fx: F) {
    fx.publish(&ids(20)).await;
    let store = Arc::new(MemoryStore::new());
    let runs = Runs::default();
    let calls = Arc::new(AtomicU32::new(0));
    let slow = || {
        counting(
            &store,
            InboxConfig::default(),
            &runs,
            &calls,
            Duration::from_millis(100),
        )
    };
    let cfg = config();
    let (stop, signal) = shutdown();
    let task = tokio::spawn(consume(
        fx.source("w1", &cfg).await,
        cfg.clone(),
        slow(),
        signal,
    ));
    wait_until("some ran", || runs.lock().unwrap().len() >= 2).await;
    stop.shut_down();
    let first = task.await.unwrap().unwrap();
    assert!(first.processed < 20, "stopped early: {first:?}");
    assert_eq!(
        first.processed + first.duplicates,
        u64::from(calls.load(Ordering::SeqCst)),
        "every started delivery settled: {first:?}"
    );
    assert_eq!(
        fx.outstanding().await,
        20 - first.processed,
        "the rest is back at the broker, the started ones acked"
    );
    let (stop, signal) = shutdown();
    let task = tokio::spawn(consume(fx.source("w2", &cfg).await, cfg, slow(), signal));
    wait_until("all ran", || runs.lock().unwrap().len() == 20).await;
    stop.shut_down();
    let second = task.await.unwrap().unwrap();
    assert_eq!(first.processed + second.processed, 20);
    assert!(all_once(&runs, 20));
    assert_eq!(fx.outstanding().await, 0);
    fx.cleanup().await;
}

/// With one message in flight: one at a time, in publish order.
pub async fn with_one_in_flight_order_is_kept<F: BrokerFactory>(fx: F) {
    fx.publish(&ids(10)).await;
    let (order, most) = (Arc::default(), Arc::new(AtomicU32::new(0)));
    let cfg = one_in_flight();
    let (stop, signal) = shutdown();
    let handler = one_at_a_time_probe(&order, &most);
    let task = tokio::spawn(consume(fx.source("w1", &cfg).await, cfg, handler, signal));
    wait_until("all ran", || order.lock().unwrap().len() == 10).await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_one_at_a_time(&stats, &order, &most, 10);
    fx.cleanup().await;
}

/// A handler failing once: the message comes back no sooner than `retry_delay`, and is
/// then handled.
pub async fn a_retry_comes_back_after_its_delay<F: BrokerFactory>(fx: F) {
    fx.publish(&strings(&["flaky"])).await;
    let attempts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let handler = {
        let attempts = Arc::clone(&attempts);
        with_inbox(
            Inbox::new(MemoryStore::new()),
            move |_lease, _d: Delivery| {
                let attempts = Arc::clone(&attempts);
                async move {
                    let n = {
                        let mut a = attempts.lock().unwrap();
                        a.push(Instant::now());
                        a.len()
                    };
                    if n == 1 {
                        return Err("first attempt fails");
                    }
                    Ok(None)
                }
            },
        )
    };
    let delay = Duration::from_millis(100);
    let cfg = ConsumerConfig {
        retry_delay: delay,
        ..config()
    };
    let (stop, signal) = shutdown();
    let task = tokio::spawn(consume(fx.source("w1", &cfg).await, cfg, handler, signal));
    wait_until("it came back", || attempts.lock().unwrap().len() == 2).await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    let a = attempts.lock().unwrap().clone();
    assert!(a[1] - a[0] >= delay, "came back after {:?}", a[1] - a[0]);
    assert_eq!((stats.errors, stats.processed), (1, 1), "{stats:?}");
    assert_eq!(fx.outstanding().await, 0);
    fx.cleanup().await;
}

/// A handler that always fails, 3 attempts allowed: 3 runs, then the message is at the
/// dead-letter destination with its id and why, and the original is settled.
pub async fn a_message_past_its_attempt_limit_reaches_the_dead_letters<F: BrokerFactory>(fx: F) {
    fx.publish(&strings(&["poison"])).await;
    let runs = Arc::new(AtomicU32::new(0));
    let cfg = config();
    let (stop, signal) = shutdown();
    let handler = poison(MemoryStore::new(), 3, &runs);
    let task = tokio::spawn(consume(fx.source("w1", &cfg).await, cfg, handler, signal));
    let dead = dead_letters_at_least(&fx, 1).await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].message_id.as_deref(), Some("poison"));
    assert!(
        dead[0]
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("attempts used up")),
        "{dead:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "three attempts, then no more"
    );
    assert_eq!((stats.errors, stats.dead_letters), (3, 1), "{stats:?}");
    assert_eq!(fx.outstanding().await, 0, "the original was settled");
    fx.cleanup().await;
}

/// A row published with a correlation id, a causation id and a `traceparent` (as
/// `support::row` writes them) arrives with them: `Delivery::correlation_id`,
/// `causation_id` and `trace` read them, and the handler runs with that trace in scope.
pub async fn a_delivery_carries_its_trace_and_the_handler_runs_in_it<F: BrokerFactory>(fx: F) {
    fx.publish(&strings(&["order-1"])).await;
    let seen = Arc::new(Mutex::new(Vec::<(Delivery, Option<MessageTrace>)>::new()));
    let handler = {
        let seen = Arc::clone(&seen);
        with_inbox(
            Inbox::from_arc(Arc::new(MemoryStore::new()), InboxConfig::default()),
            move |_lease, d: Delivery| {
                let seen = Arc::clone(&seen);
                async move {
                    seen.lock().unwrap().push((d, MessageTrace::current()));
                    Ok::<_, dedup_core::Error>(None)
                }
            },
        )
    };
    let cfg = config();
    let (stop, signal) = shutdown();
    let task = tokio::spawn(consume(fx.source("w1", &cfg).await, cfg, handler, signal));
    wait_until("the order handled", || !seen.lock().unwrap().is_empty()).await;
    stop.shut_down();
    task.await.unwrap().unwrap();
    let (d, in_scope) = seen.lock().unwrap()[0].clone();
    assert_eq!(d.correlation_id(), Some("corr-order-1"), "{d:?}");
    assert_eq!(d.causation_id(), Some("cause-order-1"), "{d:?}");
    let trace = d.trace().expect("a message id");
    assert_eq!(
        trace.traceparent(),
        TraceParent::derived("corr-order-1", "order-1"),
        "{d:?}"
    );
    assert_eq!(
        in_scope,
        Some(trace),
        "the handler runs with the delivery's trace"
    );
    fx.cleanup().await;
}

/// A handler that always fails (`cannot parse`), 3 attempts allowed, under the consumer
/// name `billing`: the dead-lettered copy says why, as headers: the failure's kind
/// (`handler`), its message, the attempts (3), the consumer and when (RFC 3339, within
/// the run).
pub async fn a_dead_lettered_copy_carries_its_cause<F: BrokerFactory>(fx: F) {
    fx.publish(&strings(&["poison"])).await;
    let runs = Arc::new(AtomicU32::new(0));
    let cfg = ConsumerConfig {
        consumer: Some("billing".into()),
        ..config()
    };
    let started = std::time::SystemTime::now();
    let (stop, signal) = shutdown();
    let handler = poison(MemoryStore::new(), 3, &runs);
    let task = tokio::spawn(consume(fx.source("w1", &cfg).await, cfg, handler, signal));
    let dead = dead_letters_at_least(&fx, 1).await;
    stop.shut_down();
    task.await.unwrap().unwrap();
    let copy = &dead[0];
    assert_eq!(copy.message_id.as_deref(), Some("poison"), "{copy:?}");
    assert_eq!(
        copy.header(FAILURE_KIND_HEADER),
        Some("handler"),
        "{copy:?}"
    );
    assert_eq!(
        copy.header(FAILURE_MESSAGE_HEADER),
        Some("cannot parse"),
        "{copy:?}"
    );
    assert_eq!(copy.header(FAILURE_ATTEMPTS_HEADER), Some("3"), "{copy:?}");
    assert_eq!(
        copy.header(FAILURE_CONSUMER_HEADER),
        Some("billing"),
        "{copy:?}"
    );
    let time = copy.header(FAILURE_TIME_HEADER).expect("a failure time");
    let at = parse_rfc3339(time).unwrap_or_else(|| panic!("not RFC 3339: {time}"));
    let now = std::time::SystemTime::now();
    let from = started - Duration::from_millis(1);
    assert!(at >= from && at <= now, "{time} is not within the run");
    fx.cleanup().await;
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` as a time.
fn parse_rfc3339(text: &str) -> Option<std::time::SystemTime> {
    let b = text.as_bytes();
    if b.len() != 24 || b[4] != b'-' || b[10] != b'T' || b[19] != b'.' || b[23] != b'Z' {
        return None;
    }
    let n = |r: std::ops::Range<usize>| text.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (hh, mm, ss, ms) = (n(11..13)?, n(14..16)?, n(17..19)?, n(20..23)?);
    // Days from the civil date (Howard Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let millis = ((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1000 + ms) as u64;
    Some(std::time::UNIX_EPOCH + Duration::from_millis(millis))
}
