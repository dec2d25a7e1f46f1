//! Replay from the JetStream stream capturing a consumer's dead-letter subject, against the
//! real NATS server (`DEDUP_NATS_URL`): each copy goes back to its subject and runs once,
//! also within the origin stream's duplicate window.

mod replay_suite;
mod support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_nats::jetstream::Context;
use async_nats::jetstream::stream::Config as StreamConfig;
use async_trait::async_trait;
use dedup_brokers::nats::{MSG_ID_HEADER, NatsConsumer, NatsDeadLetters, NatsPublisher};
use dedup_brokers::replay::{self, DeadLetters, Pick};
use dedup_brokers::{ConsumerConfig, FAILURE_CONSUMER_HEADER};
use dedup_core::outbox::Publisher;
use replay_suite::{ReplayBroker, World, replay_scenarios, strings};
use support::row;

const DURABLE: &str = "billing";
/// The streams' duplicate window unless a test sets one: short, so that a replay soon
/// after a message's first publish is not dropped.
const WINDOW: Duration = Duration::from_millis(100);

struct Fixture {
    url: String,
    js: Context,
    stream: String,
    subject: String,
    dead_stream: String,
    dead_subject: String,
}

impl Fixture {
    /// Streams for the messages and for their dead letters, with these duplicate windows.
    async fn with_windows(window: Duration, dead_window: Duration) -> Option<Fixture> {
        let url = dedup_conformance::server_url("DEDUP_NATS_URL")?;
        let client = async_nats::connect(url.as_str()).await.expect("connect");
        let js = async_nats::jetstream::new(client);
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let fx = Fixture {
            url,
            js,
            stream: format!("DEDUP_REPLAY_{tag}"),
            subject: format!("dedup.{tag}.orders"),
            dead_stream: format!("DEDUP_REPLAY_{tag}_DEAD"),
            dead_subject: format!("dedup.{tag}.dead"),
        };
        for (name, subject, window) in [
            (&fx.stream, &fx.subject, window),
            (&fx.dead_stream, &fx.dead_subject, dead_window),
        ] {
            let config = StreamConfig {
                name: name.clone(),
                subjects: vec![subject.clone()],
                duplicate_window: window,
                ..StreamConfig::default()
            };
            fx.js
                .create_stream(config)
                .await
                .expect("creating a stream");
        }
        Some(fx)
    }

    fn dead_url(&self) -> String {
        format!("{}?stream={}", self.url, self.dead_stream)
    }
}

#[async_trait]
impl ReplayBroker for Fixture {
    type Source = NatsConsumer;
    type Letters = NatsDeadLetters;

    async fn new() -> Option<Self> {
        Fixture::with_windows(WINDOW, WINDOW).await
    }

    fn consumer(&self) -> String {
        DURABLE.to_owned()
    }

    async fn publish(&self, ids: &[String]) {
        let publisher = NatsPublisher::new(self.js.clone());
        for id in ids {
            publisher.publish(&row(&self.subject, id)).await.unwrap();
        }
    }

    async fn source(&self, config: &ConsumerConfig) -> NatsConsumer {
        NatsConsumer::new(self.js.clone(), &self.stream, DURABLE, config.clone())
            .dead_letter_subject(&self.dead_subject)
            .ack_wait(Duration::from_secs(5))
    }

    async fn dead_letters(&self) -> NatsDeadLetters {
        NatsDeadLetters::open(&self.dead_url()).await.unwrap()
    }

    async fn cleanup(self) {
        for s in [&self.stream, &self.dead_stream] {
            let _ = self.js.delete_stream(s).await;
        }
    }
}

replay_scenarios!(Fixture);

/// A copy names the subject it was read from; the replayed message carries its message
/// id, payload and own headers, not the failure's nor the origin's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_goes_back_to_its_subject_with_its_own_headers() {
    let Some(fx) = <Fixture as ReplayBroker>::new().await else {
        return;
    };
    let w = World::start(fx).await;
    w.dead_letter(&strings(&["bad-1"])).await;
    let mut dead = w.fx.dead_letters().await;
    let letters = dead.take(10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].origin, w.fx.subject);
    assert_eq!(letters[0].header(FAILURE_CONSUMER_HEADER), Some(DURABLE));
    drop(dead);

    let report = w.replay(&Pick::All).await;
    assert_eq!(report.replayed, ["bad-1"], "{report:?}");
    let stream = w.fx.js.get_stream(&w.fx.stream).await.unwrap();
    let last = stream
        .get_last_raw_message_by_subject(&w.fx.subject)
        .await
        .unwrap();
    let id = last.headers.get(MSG_ID_HEADER).map(|v| v.as_str());
    assert_eq!(id, Some("bad-1"));
    assert_eq!(last.payload, "payload of bad-1");
    assert_eq!(last.headers.get("tenant").map(|v| v.as_str()), Some("acme"));
    for (name, _) in last.headers.iter() {
        let name: &str = name.as_ref();
        assert!(
            !replay::is_dead_letter_header(name) && name != dedup_brokers::nats::ORIGIN_HEADER,
            "{name}"
        );
    }
    w.finish().await;
}

/// Within the origin stream's duplicate window, JetStream drops the republished copy: the
/// republish waits the window out, and the message then runs once. A window longer than
/// the session waits fails the republish, and leaves the copy among the dead letters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_within_the_duplicate_window_waits_it_out() {
    let window = Duration::from_secs(2);
    let Some(fx) = Fixture::with_windows(window, WINDOW).await else {
        return;
    };
    let w = World::start(fx).await;
    let published = Instant::now();
    w.dead_letter(&strings(&["bad-1"])).await;
    let mut short =
        w.fx.dead_letters()
            .await
            .duplicate_wait(Duration::from_secs(1));
    let consumer = w.fx.consumer();
    let refused = replay::replay(&mut short, &*w.store, &consumer, &Pick::All, 10).await;
    let refused = refused.expect_err("a window longer than the wait");
    let chain = dedup_core::error_chain(&*refused.source);
    assert!(chain.contains("duplicate window"), "{chain}");
    assert!(w.dead_ids().await.contains("bad-1"), "the copy stays");

    let report = w.replay(&Pick::All).await;
    assert_eq!(report.replayed, ["bad-1"], "{report:?}");
    assert!(published.elapsed() >= window, "it waited the window out");
    let runs = w.runs_after(&strings(&["bad-1"])).await;
    assert_eq!(runs.get("bad-1"), Some(&1), "{runs:?}");
    assert!(w.dead_ids().await.is_empty());
    w.finish().await;
}

/// A replayed message that fails again within the dead-letter stream's duplicate window:
/// its new copy is dead-lettered once the window has passed, never dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_message_that_fails_again_is_dead_lettered_again() {
    let Some(fx) = Fixture::with_windows(WINDOW, Duration::from_secs(2)).await else {
        return;
    };
    let w = World::start(fx).await;
    w.dead_letter(&strings(&["bad-1"])).await;
    w.broken.store(true, Ordering::SeqCst);
    let report = w.replay(&Pick::All).await;
    assert_eq!(report.replayed, ["bad-1"], "{report:?}");
    let mut again = false;
    for _ in 0..100 {
        if w.dead_ids().await.contains("bad-1") {
            again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(again, "the failed message is among the dead letters again");
    w.finish().await;
}

/// `replay::open` opens a `nats://` URL's `?stream=`; a missing stream is refused.
#[tokio::test]
async fn open_reads_the_stream_from_the_url() {
    let Some(fx) = <Fixture as ReplayBroker>::new().await else {
        return;
    };
    let dead = replay::open(&fx.dead_url()).await.unwrap();
    assert_eq!(dead.describe(), format!("NATS stream {:?}", fx.dead_stream));
    let missing = replay::open(&fx.url).await.err().expect("no stream named");
    assert!(missing.to_string().contains("?stream="), "{missing}");
    let absent = format!(
        "{}?stream=NO_SUCH_{}",
        fx.url,
        uuid::Uuid::new_v4().simple()
    );
    let refused = replay::open(&absent).await.err().expect("no such stream");
    assert!(
        matches!(refused, dedup_brokers::BrokerError::Refused { .. }),
        "{refused:?}"
    );
    fx.cleanup().await;
}
