//! A real consumer on a real broker (Redis Streams) over the console's store: its handler
//! fails the messages whose id starts with `bad` until it is fixed, so they are
//! dead-lettered, and the console reads and replays them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use dedup::outbox::{OutboxRow, Publisher};
use dedup::{Admin, BoxError, Inbox, InboxConfig, Timestamp};
use dedup_brokers::redis_streams::{StreamConsumer, StreamPublisher, dead_stream};
use dedup_brokers::{
    ConsumerConfig, ConsumerStats, Delivery, ShutdownTrigger, shutdown, with_inbox,
};
use dedup_console::{Console, ConsoleConfig};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

use super::{TOKEN, Target};

/// The consumer (the Redis consumer group) whose keys the console shows.
pub const CONSUMER: &str = "billing";

/// The payload of `bad-json`: markup to escape, a field to redact.
pub const JSON_BODY: &str = r#"{"order":"<script>alert(1)</script>","card":"4242424242424242"}"#;

/// A header the console's redaction hook masks.
pub const SECRET_HEADER: &str = "authorization";

/// The consumer and its broker.
pub struct Broker {
    /// The store the consumer's inbox and the console share.
    pub target: Target,
    /// The store's admin.
    pub admin: Arc<dyn Admin>,
    /// The consumed stream.
    pub stream: String,
    /// `redis://...?stream=STREAM`: the dead letters.
    pub dead_url: String,
    conn: MultiplexedConnection,
    /// Good handler runs per message id.
    pub runs: Arc<Mutex<HashMap<String, u32>>>,
    /// While set, the handler fails the `bad` messages.
    pub broken: Arc<AtomicBool>,
    running: Option<(
        ShutdownTrigger,
        tokio::task::JoinHandle<Result<ConsumerStats, dedup_brokers::BrokerError>>,
    )>,
}

/// The bad messages [`Broker::start`] publishes: JSON (escaped, redacted), binary
/// (hex), and one over the body limit (cut).
pub const BAD: [&str; 3] = ["bad-json", "bad-binary", "bad-big"];

fn payload(id: &str) -> Vec<u8> {
    match id {
        "bad-json" => JSON_BODY.as_bytes().to_vec(),
        "bad-binary" => vec![0xff, 0x00, 0x41, 0x42],
        "bad-big" => vec![b'x'; dedup_console::BODY_LIMIT + 100],
        other => format!("payload of {other}").into_bytes(),
    }
}

fn row(stream: &str, id: &str) -> OutboxRow {
    OutboxRow {
        id: 1,
        destination: stream.into(),
        message_id: id.into(),
        headers: vec![
            ("tenant".into(), "acme".into()),
            (SECRET_HEADER.into(), "Bearer s3cr3t".into()),
        ],
        payload: payload(id),
        ordering_key: None,
        written_at: Timestamp::from_system_time(SystemTime::now()),
        attempts: 1,
    }
}

impl Broker {
    /// A consumer of a fresh stream over a fresh `backend` store, broken; `ok-1` and the
    /// [`BAD`] messages published, the bad ones dead-lettered. `None`: no Redis (skip).
    pub async fn start(backend: &'static str) -> Option<Broker> {
        let url = super::server("DEDUP_REDIS_URL")?;
        let target = super::target(backend)?;
        let admin = dedup::open_admin(&target.url)
            .await
            .expect("open the store");
        let client = redis::Client::open(url.as_str()).expect("redis URL");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to redis");
        let stream = format!("console-replay-{}", uuid::Uuid::new_v4().simple());
        let sep = if url.contains('?') { '&' } else { '?' };
        let mut b = Broker {
            target,
            admin,
            dead_url: format!("{url}{sep}stream={stream}"),
            stream,
            conn,
            runs: Arc::default(),
            broken: Arc::new(AtomicBool::new(true)),
            running: None,
        };
        b.run(client);
        let publisher = StreamPublisher::new(b.conn.clone());
        for id in ["ok-1"].into_iter().chain(BAD) {
            publisher
                .publish(&row(&b.stream, id))
                .await
                .expect("publish");
        }
        b.wait("the bad messages dead-lettered and ok-1 run", async |b| {
            b.dead_len().await == BAD.len() && b.runs_of("ok-1") == 1
        })
        .await;
        Some(b)
    }

    fn run(&mut self, client: redis::Client) {
        let config = ConsumerConfig {
            retry_delay: Duration::from_millis(50),
            ..ConsumerConfig::default()
        };
        let consumer = StreamConsumer::new(client, &self.stream, CONSUMER, "worker-1", config)
            .claim_idle(Duration::from_millis(150));
        let inbox = Inbox::from_arc(
            self.admin.clone(),
            InboxConfig {
                max_attempts: Some(1),
                ..InboxConfig::default()
            },
        );
        let (runs, broken) = (self.runs.clone(), self.broken.clone());
        let handler = with_inbox(inbox, move |_lease, d: Delivery| {
            let (runs, broken) = (runs.clone(), broken.clone());
            async move {
                let id = d.message_id.unwrap_or_default();
                if broken.load(Ordering::SeqCst) && id.starts_with("bad") {
                    return Err::<Option<Vec<u8>>, BoxError>("cannot parse the order".into());
                }
                *runs.lock().unwrap().entry(id).or_default() += 1;
                Ok(None)
            }
        });
        let (stop, signal) = shutdown();
        self.running = Some((stop, tokio::spawn(consumer.run(handler, signal))));
    }

    /// Good runs of `id` so far.
    pub fn runs_of(&self, id: &str) -> u32 {
        self.runs.lock().unwrap().get(id).copied().unwrap_or(0)
    }

    /// Entries in the dead-letter stream.
    pub async fn dead_len(&self) -> usize {
        self.conn
            .clone()
            .xlen(dead_stream(&self.stream))
            .await
            .expect("XLEN")
    }

    /// Waits until `cond` holds, 10 s at most.
    pub async fn wait(&self, what: &str, cond: impl AsyncFn(&Broker) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !cond(self).await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting until {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until each of `ids` ran, then a little more, and checks each ran once.
    pub async fn ran_once(&self, ids: &[&str]) {
        for id in ids {
            self.wait(&format!("{id} ran"), async |b| b.runs_of(id) >= 1)
                .await;
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
        for id in ids {
            assert_eq!(self.runs_of(id), 1, "{id} ran more than once");
        }
    }

    /// A console over the store with writes allowed, reading the dead letters, its
    /// redaction hook masking [`SECRET_HEADER`] and the JSON field `card`.
    pub fn console(&self) -> Console {
        let mut config = ConsoleConfig::default();
        config.allow_writes = true;
        config.token = Some(TOKEN.to_owned());
        Console::new(self.admin.clone(), &self.target.url, config)
            .expect("config")
            .with_dead_letters(CONSUMER, &self.dead_url)
            .with_redact(|headers, body| {
                for (name, value) in headers.iter_mut() {
                    if name == SECRET_HEADER {
                        *value = "***".into();
                    }
                }
                if let Ok(mut json) = serde_json::from_slice::<serde_json::Value>(body)
                    && let Some(card) = json.get_mut("card")
                {
                    *card = "***".into();
                    *body = serde_json::to_vec(&json).expect("JSON");
                }
            })
    }

    /// Stops the consumer and removes the streams.
    pub async fn cleanup(mut self) {
        if let Some((stop, running)) = self.running.take() {
            stop.shut_down();
            running.await.expect("join").expect("the consumer stopped");
        }
        let _: () = self
            .conn
            .clone()
            .del(&[&self.stream, &dead_stream(&self.stream)])
            .await
            .expect("DEL");
    }
}
