//! `dedup replay` end to end: the built binary against a real Redis Streams consumer's dead
//! letters (`DEDUP_REDIS_URL`) and a SQLite store. A bad deploy dead-letters messages of two
//! failure groups; after the fix, the binary replays one key, then a group, then all, and
//! each message runs once.

use std::collections::HashMap;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dedup_brokers::redis_streams::{StreamConsumer, StreamPublisher, dead_stream};
use dedup_brokers::{ConsumerConfig, Delivery, shutdown, with_inbox};
use dedup_core::outbox::{OutboxRow, Publisher};
use dedup_core::{DedupStore, Inbox, InboxConfig, Key, Timestamp};
use dedup_sqlite::SqliteStore;
use redis::AsyncCommands;
use serde_json::Value;

const CONSUMER: &str = "billing";

type Runs = Arc<Mutex<HashMap<String, u32>>>;

fn runs_of(runs: &Runs, id: &str) -> u32 {
    runs.lock().unwrap().get(id).copied().unwrap_or(0)
}

/// The binary's answer: exit code and JSON output.
fn dedup(args: &[&str]) -> (i32, Value, String) {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_dedup"))
        .args(args)
        .output()
        .expect("run dedup");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), json, stderr)
}

fn ids(json: &Value, field: &str) -> Vec<String> {
    json[field]
        .as_array()
        .unwrap_or_else(|| panic!("{field} in {json}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting until {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_by_key_then_group_then_all_runs_each_once() {
    let Some(url) = dedup_conformance::server_url("DEDUP_REDIS_URL") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dedup.db");
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let store_url = format!("sqlite:{}", path.display());
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let stream = format!("dedup-cli-replay-{}", uuid::Uuid::new_v4().simple());
    let sep = if url.contains('?') { '&' } else { '?' };
    let dead_url = format!("{url}{sep}stream={stream}");

    // The consumer: a bad deploy fails the `bad-` ids, with two errors (two groups).
    let (runs, broken) = (Runs::default(), Arc::new(AtomicBool::new(true)));
    let inbox = Inbox::from_arc(
        Arc::clone(&store),
        InboxConfig {
            max_attempts: Some(1),
            ..InboxConfig::default()
        },
    );
    let handler = {
        let (runs, broken) = (Arc::clone(&runs), Arc::clone(&broken));
        with_inbox(inbox, move |_lease, d: Delivery| {
            let id = d.message_id.unwrap_or_default();
            let error = match (broken.load(Ordering::SeqCst), id.as_str()) {
                (true, "bad-3") => Some("the bank timed out"),
                (true, id) if id.starts_with("bad-") => Some("cannot parse the order"),
                _ => None,
            };
            if error.is_none() {
                *runs.lock().unwrap().entry(id).or_default() += 1;
            }
            async move {
                match error {
                    Some(e) => Err(e),
                    None => Ok(Some(b"done".to_vec())),
                }
            }
        })
    };
    let config = ConsumerConfig {
        consumer: Some(CONSUMER.into()),
        ..ConsumerConfig::default()
    };
    let consumer = StreamConsumer::new(client.clone(), &stream, "g", "w1", config)
        .claim_idle(Duration::from_millis(150));
    let (stop, signal) = shutdown();
    let running = tokio::spawn(consumer.run(handler, signal));
    let publisher = StreamPublisher::new(conn.clone());
    for id in ["good-1", "bad-1", "bad-2", "bad-3"] {
        publisher.publish(&row(&stream, id)).await.unwrap();
    }
    let dead = dead_stream(&stream);
    for _ in 0..200 {
        let n: usize = conn.xlen(&dead).await.unwrap();
        if n == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let n: usize = conn.xlen(&dead).await.unwrap();
    assert_eq!(n, 3, "three dead letters");
    let record = store.get(&Key::new(CONSUMER, "bad-2").unwrap()).await;
    let group = dedup_core::admin::failure_group(&record.unwrap().unwrap()).unwrap();
    broken.store(false, Ordering::SeqCst);

    let base = ["--store", &store_url, "--json", "replay"];
    let with = |more: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        args.extend(["--dead-letters", &dead_url, "--consumer", CONSUMER].map(String::from));
        args.extend(more.iter().map(|s| s.to_string()));
        args
    };
    let run = |more: &[&str]| {
        let args = with(more);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        dedup(&refs)
    };

    // A dry run changes nothing.
    let (code, json, err) = run(&["--group", &group.id, "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(ids(&json, "replayed"), ["bad-1", "bad-2"], "{json}");
    assert_eq!(json["dry_run"], true);
    let n: usize = conn.xlen(&dead).await.unwrap();
    assert_eq!(n, 3, "a dry run settles nothing");

    // One key.
    let (code, json, err) = run(&["--id", "bad-1"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(ids(&json, "replayed"), ["bad-1"], "{json}");
    assert_eq!(json["not_picked"], 2);
    wait_until("bad-1 ran", || runs_of(&runs, "bad-1") == 1).await;

    // The group's other key: bad-1, processed now, has left the group.
    let (code, json, err) = run(&["--group", &group.id]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(ids(&json, "replayed"), ["bad-2"], "{json}");
    wait_until("bad-2 ran", || runs_of(&runs, "bad-2") == 1).await;

    // An id without a copy: left, exit code 4.
    let (code, json, _) = run(&["--id", "never-sent"]);
    assert_eq!(code, 4, "{json}");
    assert_eq!(ids(&json, "missing"), ["never-sent"]);

    // All the rest, then again: nothing left.
    let (code, json, err) = run(&["--all"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(ids(&json, "replayed"), ["bad-3"], "{json}");
    wait_until("bad-3 ran", || runs_of(&runs, "bad-3") == 1).await;
    let (code, json, err) = run(&["--all"]);
    assert_eq!(code, 0, "{err}");
    assert!(ids(&json, "replayed").is_empty(), "{json}");
    let n: usize = conn.xlen(&dead).await.unwrap();
    assert_eq!(n, 0, "every copy settled");
    tokio::time::sleep(Duration::from_millis(300)).await;
    for id in ["good-1", "bad-1", "bad-2", "bad-3"] {
        assert_eq!(runs_of(&runs, id), 1, "{id} ran once");
    }

    // A URL no broker opens: a usage error.
    let (code, _, err) = dedup(&[
        "--store",
        &store_url,
        "replay",
        "--dead-letters",
        "ftp://x",
        "--consumer",
        CONSUMER,
        "--all",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no dead letters for the scheme"), "{err}");

    stop.shut_down();
    running.await.unwrap().unwrap();
    let _: () = conn.del(&[&stream, &dead]).await.unwrap();
}

fn row(stream: &str, id: &str) -> OutboxRow {
    OutboxRow {
        id: 1,
        destination: stream.into(),
        message_id: id.into(),
        headers: vec![("tenant".into(), "acme".into())],
        payload: format!("payload of {id}").into_bytes(),
        ordering_key: None,
        written_at: Timestamp::from_system_time(std::time::SystemTime::now()),
        attempts: 1,
    }
}
