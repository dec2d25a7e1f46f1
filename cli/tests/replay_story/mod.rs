//! The operator's story at scale, on Kafka, run by hand (`--ignored`). A bad deploy
//! dead-letters 200 messages of 8 keys over 4 partitions. The console shows the counts,
//! the one failure group and a message. After the fix, `dedup replay --group` puts them
//! back: each runs once, on its key's partition, in its key's order. The screens then
//! show 200 processed, and a second replay finds nothing to do.

use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use dedup_brokers::kafka::KafkaPublisher;
use dedup_brokers::{ConsumerConfig, Delivery, Handle, consume, shutdown, with_inbox};
use dedup_core::outbox::Publisher;
use dedup_core::{Admin, DedupStore, Inbox, InboxConfig, Key, Status, Timestamp};
use dedup_sqlite::SqliteStore;
use serde_json::Value;

use crate::{Broker, CONSUMER, Kafka, dead_len, row};

/// Messages the bad deploy dead-letters.
const MESSAGES: usize = 200;
/// Their keys (customers): each key's records share a partition.
const KEYS: usize = 8;
/// Attempts per message before it is dead-lettered.
const MAX_ATTEMPTS: u32 = 2;
/// What the bad deploy's handler answers every message.
const BUG: &str = "order schema v7: missing field `currency`";

/// The message ids in publish order: `order-000` .. `order-199`.
fn id(n: usize) -> String {
    format!("order-{n:03}")
}

/// The key (customer) of message `n`.
fn key_of(n: usize) -> String {
    format!("customer-{}", n % KEYS)
}

/// What the handler saw, per message id.
#[derive(Default)]
struct Seen {
    /// Runs of the bad deploy (each failed).
    failed: HashMap<String, u32>,
    /// Runs of the fixed handler: the record's `partition/offset`, per run.
    fixed: HashMap<String, Vec<(i32, i64)>>,
    /// The partition each key was first read from.
    partition_of: HashMap<String, i32>,
}

type Shared = Arc<Mutex<Seen>>;

/// `partition/offset` out of a Kafka delivery's `topic/partition/offset`.
fn place(d: &Delivery) -> (i32, i64) {
    let mut parts = d.broker_ref.rsplit('/');
    let offset = parts.next().unwrap().parse().unwrap();
    let partition = parts.next().unwrap().parse().unwrap();
    (partition, offset)
}

/// The handler: while `broken`, every message fails with [`BUG`].
fn handler(store: &Arc<SqliteStore>, seen: &Shared, broken: &Arc<AtomicBool>) -> impl Handle {
    let inbox = Inbox::from_arc(
        Arc::clone(store),
        InboxConfig {
            max_attempts: Some(MAX_ATTEMPTS),
            ..InboxConfig::default()
        },
    );
    let (seen, broken) = (Arc::clone(seen), Arc::clone(broken));
    with_inbox(inbox, move |_lease, d: Delivery| {
        let id = d.message_id.clone().unwrap_or_default();
        let key = d.header("customer").unwrap_or_default().to_owned();
        let broken = broken.load(Ordering::SeqCst);
        {
            let mut seen = seen.lock().unwrap();
            let at = place(&d);
            seen.partition_of.entry(key).or_insert(at.0);
            if broken {
                *seen.failed.entry(id).or_default() += 1;
            } else {
                seen.fixed.entry(id).or_default().push(at);
            }
        }
        async move {
            if broken {
                Err(BUG)
            } else {
                Ok(Some(b"charged".to_vec()))
            }
        }
    })
}

/// The console's JSON at `path`, served at `addr`.
async fn screen(addr: &str, path: &str) -> Value {
    let (addr, path) = (addr.to_owned(), path.to_owned());
    let (status, text) = tokio::task::spawn_blocking(move || crate::support::get(&addr, &path))
        .await
        .unwrap();
    assert_eq!(status, 200, "{text}");
    let body = &text[text.find("\r\n\r\n").expect("a body") + 4..];
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The overview's JSON, its one consumer's line printed.
async fn overview_screen(addr: &str) -> Value {
    let o = screen(addr, "/api/overview").await;
    let l = &o["consumers"][0];
    eprintln!(
        "/api/overview: {} processed {}, dead_lettered {}, failed {}, in_flight {}",
        l["consumer"], l["processed"], l["dead_lettered"], l["failed"], l["in_flight"]
    );
    o
}

/// `dedup replay` with `more`: exit code and the words it printed.
fn replay(store_url: &str, dead_url: &str, more: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dedup"))
        .args(["--store", store_url, "replay", "--dead-letters", dead_url])
        .args(["--consumer", CONSUMER])
        .args(more)
        .output()
        .expect("run dedup");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let text = text.trim().to_owned();
    eprintln!(
        "$ dedup replay --consumer {CONSUMER} {}\n{text}",
        more.join(" ")
    );
    (out.status.code().unwrap_or(-1), text)
}

/// Message ids by status, over the 200.
async fn statuses(store: &SqliteStore) -> BTreeMap<&'static str, usize> {
    let mut out = BTreeMap::new();
    for n in 0..MESSAGES {
        let key = Key::new(CONSUMER, id(n)).unwrap();
        let status = match store.get(&key).await.unwrap() {
            Some(r) => Status::of(&r, Timestamp::from_system_time(SystemTime::now())).as_str(),
            None => "unseen",
        };
        *out.entry(status).or_default() += 1;
    }
    out
}

/// Waits (3 minutes at most) until `cond` holds.
async fn until(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(180);
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The dead letters' order: per key, the ids as the dead-letter copies hold them.
async fn dead_order(kafka: &Kafka) -> BTreeMap<String, Vec<String>> {
    let mut dead = kafka.dead_letters().await;
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    loop {
        let batch = dead.take(100).await.unwrap();
        if batch.is_empty() {
            break;
        }
        for letter in batch {
            let key = String::from_utf8_lossy(&letter.key.unwrap()).into_owned();
            out.entry(key).or_default().push(letter.message_id.unwrap());
        }
    }
    dead.give_back().await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the operator's story at scale: run by hand with --ignored (about a minute)"]
async fn operators_story_200_on_kafka() {
    let Some(brokers) = dedup_conformance::server_url("DEDUP_KAFKA_BROKERS") else {
        return;
    };
    let started = Instant::now();
    let mut step = Instant::now();
    let mut lap = |what: &str| {
        eprintln!("  [{what}: {:.1} s]", step.elapsed().as_secs_f64());
        step = Instant::now();
    };
    let kafka = Kafka::new(brokers, "dedup-story", 4).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dedup.db");
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let store_url = format!("sqlite:{}", path.display());
    let dead_url = kafka.dead_url();
    eprintln!("story: {MESSAGES} messages, {KEYS} keys, 4 partitions, max attempts {MAX_ATTEMPTS}");

    // 1. The bad deploy: every message fails, twice, and is dead-lettered.
    let (seen, broken) = (Shared::default(), Arc::new(AtomicBool::new(true)));
    let config = ConsumerConfig {
        consumer: Some(CONSUMER.to_owned()),
        retry_delay: Duration::from_millis(50),
        ..ConsumerConfig::default()
    };
    let (stop, signal) = shutdown();
    let source = kafka.source(config.clone());
    let running = tokio::spawn(consume(
        source,
        config,
        handler(&store, &seen, &broken),
        signal,
    ));
    let rows: Vec<_> = (0..MESSAGES)
        .map(|n| {
            let mut r = row(&kafka.topic, &id(n));
            r.ordering_key = Some(key_of(n));
            r.headers.push(("customer".into(), key_of(n)));
            r.payload =
                format!(r#"{{"order":{n},"customer":"{}","amount":42}}"#, key_of(n)).into_bytes();
            r
        })
        .collect();
    let publisher = KafkaPublisher::new(&kafka.brokers).unwrap();
    for sent in publisher.publish_all(&rows).await {
        sent.unwrap();
    }
    lap("published 200");
    until("all 200 dead-lettered", async || {
        statuses(&store).await.get("dead-letter") == Some(&MESSAGES)
    })
    .await;
    until("200 dead-letter copies", async || {
        dead_len(&kafka).await == MESSAGES
    })
    .await;
    {
        let seen = seen.lock().unwrap();
        for n in 0..MESSAGES {
            let runs = seen.failed.get(&id(n)).copied();
            assert_eq!(runs, Some(MAX_ATTEMPTS), "{} failed runs", id(n));
        }
        assert!(seen.fixed.is_empty());
    }
    let order = dead_order(&kafka).await;
    assert_eq!(order.len(), KEYS, "{order:?}");
    eprintln!(
        "dead-letter order of customer-2: {}",
        order["customer-2"].join(" ")
    );
    let in_publish_order = order.values().filter(|ids| ids.is_sorted()).count();
    eprintln!(
        "bad deploy: {MESSAGES} x {MAX_ATTEMPTS} failed runs; {MESSAGES} copies on the \
         dead-letter topic; {in_publish_order} of {KEYS} keys' copies in publish order"
    );
    lap("dead-lettered");

    // 2. The screens.
    let admin: Arc<dyn Admin> = store.clone();
    let console = dedup_console::Console::new(admin, &store_url, Default::default())
        .unwrap()
        .with_dead_letters(CONSUMER, &dead_url);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let serving = tokio::spawn(axum::serve(listener, console.router()).into_future());
    let overview = overview_screen(&addr).await;
    let line = &overview["consumers"][0];
    assert_eq!(line["consumer"], CONSUMER, "{overview}");
    assert_eq!(line["dead_lettered"], MESSAGES, "{overview}");
    assert_eq!(line["processed"], 0, "{overview}");
    let failures = screen(&addr, "/api/failures").await;
    let groups = failures["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{failures}");
    let group = groups[0]["id"].as_str().unwrap().to_owned();
    eprintln!(
        "/api/failures: {} group(s); {} keys, kind {}, first line {}, id {group}",
        groups.len(),
        groups[0]["count"],
        groups[0]["kind"],
        groups[0]["first_line"]
    );
    assert_eq!(groups[0]["count"], MESSAGES, "{failures}");
    assert!(
        groups[0]["first_line"].as_str().unwrap().contains(BUG),
        "{failures}"
    );
    let k = screen(&addr, "/api/key?consumer=billing&id=order-042").await;
    let m = &k["message"];
    eprintln!(
        "/api/key order-042: status {}, attempt {}, message {} from {}, to {}",
        k["status"], k["attempt"], m["state"], m["source"], m["origin"]
    );
    for (name, value) in m["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (&h[0], &h[1]))
    {
        eprintln!("  header {name}: {value}");
    }
    eprintln!("  body ({}): {}", m["body"]["encoding"], m["body"]["text"]);
    assert_eq!(k["status"], "dead-letter", "{k}");
    assert_eq!(m["state"], "shown", "{k}");
    let body = m["body"]["text"].as_str().unwrap();
    assert!(body.contains(r#""order":42"#), "{body}");
    let header = |name: &str| {
        m["headers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h[0] == name)
            .map(|h| h[1].as_str().unwrap().to_owned())
    };
    assert_eq!(header("customer").as_deref(), Some("customer-2"), "{m}");
    assert!(
        header("dedup-failure-message").unwrap().contains(BUG),
        "{m}"
    );
    lap("screens read");

    // 3. The fix, and the replay of the group.
    broken.store(false, Ordering::SeqCst);
    let (code, words) = replay(&store_url, &dead_url, &["--group", &group]);
    assert_eq!(code, 0, "{words}");
    assert!(words.starts_with("replayed 200 of billing"), "{words}");
    lap("replayed");
    let all_ran = || {
        let seen = seen.lock().unwrap();
        (0..MESSAGES).all(|n| seen.fixed.contains_key(&id(n)))
    };
    until("the 200 ran", async || all_ran()).await;
    lap("the consumer processed them");
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 4. Each ran once, on its key's partition, in the dead letters' order.
    {
        let seen = seen.lock().unwrap();
        let mut by_key: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
        for n in 0..MESSAGES {
            let runs = &seen.fixed[&id(n)];
            assert_eq!(runs.len(), 1, "{} ran the fixed handler {runs:?}", id(n));
            let (partition, offset) = runs[0];
            let key = key_of(n);
            assert_eq!(partition, seen.partition_of[&key], "{} moved", id(n));
            by_key.entry(key).or_default().push((offset, id(n)));
        }
        for (key, mut replayed) in by_key {
            replayed.sort();
            let ids: Vec<String> = replayed.into_iter().map(|(_, id)| id).collect();
            assert_eq!(ids, order[&key], "{key}'s order");
        }
    }
    assert_eq!(dead_len(&kafka).await, 0, "a new session takes nothing");
    let overview = overview_screen(&addr).await;
    let line = &overview["consumers"][0];
    assert_eq!(line["processed"], MESSAGES, "{overview}");
    assert_eq!(line["dead_lettered"], 0, "{overview}");
    let failures = screen(&addr, "/api/failures").await;
    eprintln!(
        "/api/failures: {} group(s)",
        failures["groups"].as_array().unwrap().len()
    );
    assert_eq!(failures["groups"], Value::Array(Vec::new()), "{failures}");
    lap("checked");

    // 5. Again, everything: nothing to do, nothing runs.
    let (code, words) = replay(&store_url, &dead_url, &["--all"]);
    assert_eq!(code, 0, "{words}");
    assert!(words.starts_with("replayed 0 of billing"), "{words}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let fixed: usize = seen.lock().unwrap().fixed.values().map(Vec::len).sum();
    assert_eq!(fixed, MESSAGES, "nothing ran again");
    lap("replayed again");
    eprintln!("story: {:.1} s in all", started.elapsed().as_secs_f64());

    serving.abort();
    stop.shut_down();
    running.await.unwrap().unwrap();
    kafka.cleanup().await;
}
