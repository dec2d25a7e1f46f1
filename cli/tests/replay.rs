//! `dedup replay` end to end: the built binary against a real consumer's dead letters
//! (Redis Streams, `DEDUP_REDIS_URL`; Kafka, `DEDUP_KAFKA_BROKERS`; RabbitMQ,
//! `DEDUP_AMQP_URL`; NATS, `DEDUP_NATS_URL`; Pub/Sub, `DEDUP_PUBSUB_EMULATOR_HOST`) and a
//! SQLite store. A bad deploy dead-letters messages of two failure groups; after the fix,
//! the binary replays one key, then a group, then all, and each message runs once.

mod replay_brokers;
mod replay_story;
mod support;

use std::collections::HashMap;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dedup_brokers::kafka::{KafkaConsumer, KafkaPublisher};
use dedup_brokers::redis_streams::{StreamConsumer, StreamPublisher, dead_stream};
use dedup_brokers::replay::DeadLetters;
use dedup_brokers::{ConsumerConfig, Delivery, Handle, Source, consume, shutdown, with_inbox};
use dedup_core::outbox::{OutboxRow, Publisher};
use dedup_core::{DedupStore, Inbox, InboxConfig, Key, Timestamp};
use dedup_sqlite::SqliteStore;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use redis::AsyncCommands;
use serde_json::Value;

const CONSUMER: &str = "billing";

type Runs = Arc<Mutex<HashMap<String, u32>>>;

fn runs_of(runs: &Runs, id: &str) -> u32 {
    runs.lock().unwrap().get(id).copied().unwrap_or(0)
}

/// The binary's answer, run with `env` added: exit code and JSON output.
fn dedup(args: &[&str], env: &[(&str, String)]) -> (i32, Value, String) {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_dedup"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run dedup");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), json, stderr)
}

/// The ids of `json[field]`, sorted (dead letters come in the order they were written).
fn ids(json: &Value, field: &str) -> Vec<String> {
    let mut ids: Vec<String> = json[field]
        .as_array()
        .unwrap_or_else(|| panic!("{field} in {json}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
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

/// A broker endpoint the scenario runs on.
trait Broker {
    type Source: Source;
    /// `--dead-letters`.
    fn dead_url(&self) -> String;
    /// The consumer name its consumer runs under and the copies name.
    fn consumer(&self) -> String {
        CONSUMER.to_owned()
    }
    /// What the binary's environment needs to open [`dead_url`](Self::dead_url).
    fn env(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// The dead letters, opened in this process.
    async fn dead_letters(&self) -> Box<dyn DeadLetters> {
        dedup_brokers::replay::open(&self.dead_url()).await.unwrap()
    }
    /// A consumer of the endpoint.
    fn source(&self, config: ConsumerConfig) -> Self::Source;
    /// Publishes one message as the application does.
    async fn publish(&self, id: &str);
    /// Removes the endpoint.
    async fn cleanup(self);
}

struct Redis {
    client: redis::Client,
    url: String,
    stream: String,
}

impl Broker for Redis {
    type Source = StreamConsumer;

    fn dead_url(&self) -> String {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        format!("{}{sep}stream={}", self.url, self.stream)
    }

    fn source(&self, config: ConsumerConfig) -> StreamConsumer {
        StreamConsumer::new(self.client.clone(), &self.stream, "g", "w1", config)
            .claim_idle(Duration::from_millis(150))
    }

    async fn publish(&self, id: &str) {
        let conn = self.client.get_multiplexed_async_connection().await;
        let publisher = StreamPublisher::new(conn.unwrap());
        publisher.publish(&row(&self.stream, id)).await.unwrap();
    }

    async fn cleanup(self) {
        let mut conn = self
            .client
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let keys = [self.stream.clone(), dead_stream(&self.stream)];
        let _: () = conn.del(&keys).await.unwrap();
    }
}

struct Kafka {
    brokers: String,
    topic: String,
    dead: String,
}

impl Kafka {
    /// Fresh topics on `brokers` (the consumed one and its dead letters), named after
    /// `prefix`, each with `partitions` partitions.
    async fn new(brokers: String, prefix: &str, partitions: i32) -> Kafka {
        let tag = uuid::Uuid::new_v4().simple();
        let kafka = Kafka {
            brokers,
            topic: format!("{prefix}-{tag}"),
            dead: format!("{prefix}-{tag}-dead"),
        };
        let new: Vec<_> = [&kafka.topic, &kafka.dead]
            .iter()
            .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
            .collect();
        for made in kafka
            .admin()
            .create_topics(&new, &AdminOptions::new())
            .await
            .unwrap()
        {
            made.unwrap();
        }
        kafka
    }

    fn admin(&self) -> AdminClient<DefaultClientContext> {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        c.create().unwrap()
    }
}

impl Broker for Kafka {
    type Source = KafkaConsumer;

    fn dead_url(&self) -> String {
        format!("kafka://{}?topic={}", self.brokers, self.dead)
    }

    /// A short session: Tansu completes a join after about half the session timeout.
    fn source(&self, config: ConsumerConfig) -> KafkaConsumer {
        let group = format!("{}-group", self.topic);
        KafkaConsumer::new(&self.brokers, group, &self.topic, &self.dead, config)
            .set("session.timeout.ms", "2000")
            .set("heartbeat.interval.ms", "300")
    }

    async fn publish(&self, id: &str) {
        let publisher = KafkaPublisher::new(&self.brokers).unwrap();
        publisher.publish(&row(&self.topic, id)).await.unwrap();
    }

    async fn cleanup(self) {
        let topics = [self.topic.as_str(), self.dead.as_str()];
        let _ = self
            .admin()
            .delete_topics(&topics, &AdminOptions::new())
            .await;
    }
}

/// How many copies the dead letters hold.
async fn dead_len(broker: &impl Broker) -> usize {
    let mut dead = broker.dead_letters().await;
    let mut n = 0;
    loop {
        let batch = dead.take(100).await.unwrap();
        if batch.is_empty() {
            break;
        }
        n += batch.len();
    }
    dead.give_back().await.unwrap();
    n
}

/// The handler: while `broken`, the `bad-` ids fail with one error, `bad-3` with another.
fn handler(store: &Arc<SqliteStore>, runs: &Runs, broken: &Arc<AtomicBool>) -> impl Handle {
    let inbox = Inbox::from_arc(
        Arc::clone(store),
        InboxConfig {
            max_attempts: Some(1),
            ..InboxConfig::default()
        },
    );
    let (runs, broken) = (Arc::clone(runs), Arc::clone(broken));
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_streams_by_key_then_group_then_all_each_run_once() {
    let Some(url) = dedup_conformance::server_url("DEDUP_REDIS_URL") else {
        return;
    };
    let broker = Redis {
        client: redis::Client::open(url.as_str()).unwrap(),
        url,
        stream: format!("dedup-cli-replay-{}", uuid::Uuid::new_v4().simple()),
    };
    scenario(broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_by_key_then_group_then_all_each_run_once() {
    let Some(brokers) = dedup_conformance::server_url("DEDUP_KAFKA_BROKERS") else {
        return;
    };
    scenario(Kafka::new(brokers, "dedup-cli-replay", 1).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_by_key_then_group_then_all_each_run_once() {
    let Some(url) = dedup_conformance::server_url("DEDUP_AMQP_URL") else {
        return;
    };
    scenario(replay_brokers::rabbitmq::Rabbit::new(url).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_by_key_then_group_then_all_each_run_once() {
    let Some(url) = dedup_conformance::server_url("DEDUP_NATS_URL") else {
        return;
    };
    scenario(replay_brokers::nats::Nats::new(url).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_by_key_then_group_then_all_each_run_once() {
    let Some(host) = dedup_conformance::server_url("DEDUP_PUBSUB_EMULATOR_HOST") else {
        return;
    };
    scenario(replay_brokers::pubsub::PubSub::new(host).await).await;
}

/// Pub/Sub on Google Cloud without credentials: a usage error that names them, not a
/// panic in Google's token source.
#[test]
fn pubsub_without_credentials_is_a_usage_error() {
    let home = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", home.path().join("dedup.db").display());
    let (code, _, err) = dedup(&["--store", &store, "migrate"], &[]);
    assert_eq!(code, 0, "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_dedup"))
        .args(["--store", &store, "replay", "--consumer", CONSUMER, "--all"])
        .args(["--dead-letters", "pubsub://p?subscription=s"])
        .env_remove("PUBSUB_EMULATOR_HOST")
        .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
        .env_remove("CLOUDSDK_CONFIG")
        .env("HOME", home.path())
        .output()
        .expect("run dedup");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("Google Cloud credentials"), "{err}");
}

async fn scenario<B: Broker>(broker: B) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dedup.db");
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let store_url = format!("sqlite:{}", path.display());
    let (dead_url, consumer, env) = (broker.dead_url(), broker.consumer(), broker.env());
    let (runs, broken) = (Runs::default(), Arc::new(AtomicBool::new(true)));
    let config = ConsumerConfig {
        consumer: Some(consumer.clone()),
        ..ConsumerConfig::default()
    };
    let (stop, signal) = shutdown();
    let source = broker.source(config.clone());
    let running = tokio::spawn(consume(
        source,
        config,
        handler(&store, &runs, &broken),
        signal,
    ));
    for id in ["good-1", "bad-1", "bad-2", "bad-3"] {
        broker.publish(id).await;
    }
    for _ in 0..100 {
        if dead_len(&broker).await == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dead_len(&broker).await, 3, "three dead letters");
    let record = store.get(&Key::new(&consumer, "bad-2").unwrap()).await;
    let group = dedup_core::admin::failure_group(&record.unwrap().unwrap()).unwrap();
    broken.store(false, Ordering::SeqCst);

    let run = |more: &[&str]| {
        let mut args = vec!["--store", &store_url, "--json", "replay"];
        args.extend(["--dead-letters", &dead_url, "--consumer", &consumer]);
        args.extend(more);
        dedup(&args, &env)
    };

    // A dry run changes nothing.
    let (code, json, err) = run(&["--group", &group.id, "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(ids(&json, "replayed"), ["bad-1", "bad-2"], "{json}");
    assert_eq!(json["dry_run"], true);
    assert_eq!(dead_len(&broker).await, 3, "a dry run settles nothing");

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
    assert_eq!(dead_len(&broker).await, 0, "every copy settled");
    tokio::time::sleep(Duration::from_millis(500)).await;
    for id in ["good-1", "bad-1", "bad-2", "bad-3"] {
        assert_eq!(runs_of(&runs, id), 1, "{id} ran once");
    }

    // A URL no broker opens: a usage error.
    let (code, _, err) = dedup(
        &[
            "--store",
            &store_url,
            "replay",
            "--dead-letters",
            "ftp://x",
            "--consumer",
            &consumer,
            "--all",
        ],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no dead letters for the scheme"), "{err}");

    stop.shut_down();
    running.await.unwrap().unwrap();
    broker.cleanup().await;
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
