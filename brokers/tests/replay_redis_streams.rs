//! Replay from Redis Streams' `<stream>:dead` against the real Redis (`DEDUP_REDIS_URL`):
//! each dead-lettered message goes back to its stream and runs once after the fix, and its
//! copy is gone.

mod replay_suite;
mod support;

use std::time::Duration;

use async_trait::async_trait;
use dedup_brokers::redis_streams::{
    DEAD_ENTRY_ID_FIELD, MESSAGE_ID_FIELD, StreamConsumer, StreamDeadLetters, StreamPublisher,
    dead_stream,
};
use dedup_brokers::replay::{self, Pick, is_dead_letter_header};
use dedup_brokers::{ConsumerConfig, Fault};
use dedup_core::outbox::Publisher;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redis::streams::StreamRangeReply;
use replay_suite::{ReplayBroker, World, replay_scenarios, strings};
use support::row;

const GROUP: &str = "billing";

struct Fixture {
    client: redis::Client,
    conn: MultiplexedConnection,
    stream: String,
    publisher: StreamPublisher,
}

impl Fixture {
    /// The message ids of the entries of `stream`, oldest first.
    async fn ids(&self, stream: &str) -> Vec<String> {
        let r: StreamRangeReply = self.conn.clone().xrange_all(stream).await.unwrap();
        r.ids
            .iter()
            .map(|e| e.get::<String>(MESSAGE_ID_FIELD).unwrap_or_default())
            .collect()
    }

    fn session(&self) -> StreamDeadLetters {
        StreamDeadLetters::new(self.conn.clone(), &self.stream)
    }
}

#[async_trait]
impl ReplayBroker for Fixture {
    type Source = StreamConsumer;
    type Letters = StreamDeadLetters;

    async fn new() -> Option<Self> {
        let url = dedup_conformance::server_url("DEDUP_REDIS_URL")?;
        let client = redis::Client::open(url.as_str()).unwrap();
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        Some(Fixture {
            client,
            publisher: StreamPublisher::new(conn.clone()),
            conn,
            stream: format!("dedup-replay-{}", uuid::Uuid::new_v4().simple()),
        })
    }

    fn consumer(&self) -> String {
        GROUP.to_owned()
    }

    async fn publish(&self, ids: &[String]) {
        for id in ids {
            self.publisher
                .publish(&row(&self.stream, id))
                .await
                .unwrap();
        }
    }

    async fn source(&self, config: &ConsumerConfig) -> StreamConsumer {
        StreamConsumer::new(
            self.client.clone(),
            &self.stream,
            GROUP,
            "worker-1",
            config.clone(),
        )
        .claim_idle(Duration::from_millis(150))
    }

    async fn dead_letters(&self) -> StreamDeadLetters {
        self.session()
    }

    async fn cleanup(self) {
        let keys = [self.stream.clone(), dead_stream(&self.stream)];
        let _: () = self.conn.clone().del(&keys).await.unwrap();
    }
}

replay_scenarios!(Fixture);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_entry_carries_the_message_not_the_failure() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let w = World::start(fx).await;
    w.dead_letter(&strings(&["bad-h"])).await;
    let report = w.replay(&Pick::All).await;
    assert_eq!(report.replayed, ["bad-h"]);
    w.runs_after(&strings(&["bad-h"])).await;
    let r: StreamRangeReply = w.fx.conn.clone().xrange_all(&w.fx.stream).await.unwrap();
    let replayed = r.ids.last().unwrap();
    assert_eq!(replayed.get::<String>(MESSAGE_ID_FIELD).unwrap(), "bad-h");
    assert_eq!(
        replayed.get::<String>("payload").unwrap(),
        "payload of bad-h"
    );
    assert_eq!(replayed.get::<String>("tenant").unwrap(), "acme");
    let fields: Vec<&String> = replayed.map.keys().collect();
    assert!(
        fields
            .iter()
            .all(|f| !is_dead_letter_header(f) && *f != DEAD_ENTRY_ID_FIELD),
        "{fields:?}"
    );
    w.finish().await;
}

/// A copy whose republish failed stays among the dead letters; the next replay puts it back.
#[tokio::test]
async fn a_failed_republish_leaves_the_copy_for_the_next_replay() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    // A dead letter as a consumer writes it, with no consumer running.
    let fault = Fault {
        kind: "handler".into(),
        message: "bad deploy".into(),
        attempts: 1,
        consumer: GROUP.into(),
        at: std::time::SystemTime::now(),
    };
    let mut fields = vec![
        (MESSAGE_ID_FIELD.to_owned(), "bad-f".to_owned()),
        ("payload".to_owned(), "payload of bad-f".to_owned()),
        (DEAD_ENTRY_ID_FIELD.to_owned(), "1-0".to_owned()),
    ];
    fields.extend(fault.headers());
    let mut conn = fx.conn.clone();
    let dead = dead_stream(&fx.stream);
    let _: String = conn.xadd(&dead, "*", &fields).await.unwrap();
    // The origin is no stream: XADD to it fails.
    let _: () = conn.set(&fx.stream, "not a stream").await.unwrap();
    let store = dedup_core::MemoryStore::new();
    let failed = replay::replay(&mut fx.session(), &store, GROUP, &Pick::All, 10).await;
    let failed = failed.unwrap_err();
    assert!(failed.step.contains("republishing"), "{failed}");
    assert!(failed.done.replayed.is_empty());
    assert_eq!(fx.ids(&dead).await, ["bad-f"], "the copy stays");

    let _: () = conn.del(&fx.stream).await.unwrap();
    let report = replay::replay(&mut fx.session(), &store, GROUP, &Pick::All, 10).await;
    assert_eq!(report.unwrap().replayed, ["bad-f"]);
    assert!(fx.ids(&dead).await.is_empty(), "the copy is settled");
    assert_eq!(fx.ids(&fx.stream).await, ["bad-f"]);
    fx.cleanup().await;
}

#[tokio::test]
async fn open_reads_the_stream_from_the_url() {
    let Some(url) = dedup_conformance::server_url("DEDUP_REDIS_URL") else {
        return;
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    let dead = replay::open(&format!("{url}{sep}stream=orders%3Aeu"))
        .await
        .unwrap();
    assert_eq!(dead.describe(), r#"Redis stream "orders:eu:dead""#);
    let missing = replay::open(&url).await.err().unwrap();
    assert!(missing.to_string().contains("?stream="), "{missing}");
}
