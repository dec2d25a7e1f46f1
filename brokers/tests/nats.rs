//! The NATS JetStream publisher and consumer against the real NATS server (`DEDUP_NATS_URL`).

mod suite;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::stream::Config as StreamConfig;
use async_nats::jetstream::{Context, message::StreamMessage};
use async_trait::async_trait;
use dedup_brokers::nats::{MSG_ID_HEADER, NatsConsumer, NatsPublisher};
use dedup_brokers::{ConsumerConfig, DEAD_LETTER_REASON, shutdown};
use dedup_core::outbox::Publisher;
use dedup_core::{InboxConfig, MemoryStore};
use suite::{BrokerFactory, DeadLetter, broker_suite};
use support::{Runs, config, counting, row};

const DURABLE: &str = "billing";
/// JetStream's own duplicate window, short so the tests can publish copies it lets through.
const WINDOW: Duration = Duration::from_millis(100);
/// How long JetStream waits for an ack before it redelivers: what the killed-consumer
/// clause waits for.
const ACK_WAIT: Duration = Duration::from_millis(500);

struct Fixture {
    client: async_nats::Client,
    js: Context,
    stream: String,
    subject: String,
    dead_stream: String,
    dead_subject: String,
}

impl Fixture {
    async fn new() -> Option<Fixture> {
        let url = dedup_conformance::server_url("DEDUP_NATS_URL")?;
        let client = async_nats::connect(url.as_str())
            .await
            .expect("connect to NATS");
        let js = async_nats::jetstream::new(client.clone());
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let fx = Fixture {
            client,
            js,
            stream: format!("DEDUP_{tag}"),
            subject: format!("dedup.{tag}.orders"),
            dead_stream: format!("DEDUP_{tag}_DEAD"),
            dead_subject: format!("dedup.{tag}.dead"),
        };
        for (name, subject) in [
            (&fx.stream, &fx.subject),
            (&fx.dead_stream, &fx.dead_subject),
        ] {
            let config = StreamConfig {
                name: name.clone(),
                subjects: vec![subject.clone()],
                duplicate_window: WINDOW,
                ..StreamConfig::default()
            };
            // nats-server 2.9 once answered a create with a 500 "error creating store for
            // stream" in a full test run (twelve tests create streams at once); the fixture
            // tries three times, printing each failure, before it gives up.
            let mut tries = 0;
            loop {
                match fx.js.create_stream(config.clone()).await {
                    Ok(_) => break,
                    Err(e) if tries < 2 => {
                        tries += 1;
                        eprintln!("creating stream {name} failed (try {tries} of 3): {e}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => panic!("creating stream {name} failed three times: {e}"),
                }
            }
        }
        Some(fx)
    }

    fn consumer(&self, config: ConsumerConfig) -> NatsConsumer {
        NatsConsumer::new(self.js.clone(), &self.stream, DURABLE, config)
            .dead_letter_subject(&self.dead_subject)
            .ack_wait(ACK_WAIT)
    }

    async fn messages(&self, stream: &str) -> Vec<StreamMessage> {
        let s = self.js.get_stream(stream).await.unwrap();
        let mut out = Vec::new();
        for seq in 1.. {
            match s.get_raw_message(seq).await {
                Ok(m) => out.push(m),
                Err(_) => break,
            }
        }
        out
    }

    async fn wait_for_dead(&self, n: usize) -> Vec<StreamMessage> {
        for _ in 0..200 {
            let dead = self.messages(&self.dead_stream).await;
            if dead.len() >= n {
                return dead;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("fewer than {n} dead letters");
    }

    async fn cleanup(self) {
        for s in [&self.stream, &self.dead_stream] {
            let _ = self.js.delete_stream(s).await;
        }
    }
}

fn header<'a>(m: &'a StreamMessage, name: &str) -> Option<&'a str> {
    m.headers.get(name).map(|v| v.as_str())
}

#[async_trait]
impl BrokerFactory for Fixture {
    type Source = NatsConsumer;

    async fn new() -> Option<Self> {
        Fixture::new().await
    }

    /// A repeated id waits out JetStream's duplicate window first, so the stream keeps
    /// every copy: the server forgets an id on a timer, some time after the window, so a
    /// copy it still took for a duplicate (the stream did not grow) is published again
    /// after another window.
    async fn publish(&self, ids: &[String]) {
        let publisher = NatsPublisher::from_client(self.client.clone());
        let mut seen = std::collections::HashSet::new();
        for (stored, id) in ids.iter().enumerate() {
            let repeated = !seen.insert(id);
            for attempt in 1.. {
                if repeated {
                    tokio::time::sleep(WINDOW + Duration::from_millis(20)).await;
                }
                publisher.publish(&row(&self.subject, id)).await.unwrap();
                if self.messages(&self.stream).await.len() > stored {
                    break;
                }
                assert!(attempt < 20, "JetStream kept dropping a copy of {id}");
            }
        }
        assert_eq!(self.messages(&self.stream).await.len(), ids.len());
    }

    async fn publish_without_id(&self, payload: &[u8]) {
        self.js
            .publish(self.subject.clone(), payload.to_vec().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    async fn source(&self, _worker: &str, config: &ConsumerConfig) -> NatsConsumer {
        self.consumer(config.clone())
    }

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        self.messages(&self.dead_stream)
            .await
            .iter()
            .map(|m| DeadLetter {
                message_id: header(m, MSG_ID_HEADER).map(str::to_owned),
                payload: m.payload.to_vec(),
                reason: header(m, DEAD_LETTER_REASON).map(str::to_owned),
                headers: m
                    .headers
                    .iter()
                    .flat_map(|(n, vs)| vs.iter().map(move |v| (n.to_string(), v.to_string())))
                    .collect(),
            })
            .collect()
    }

    /// Not delivered yet plus delivered and not acked, for the durable consumer (all the
    /// stream's messages before it exists).
    async fn outstanding(&self) -> u64 {
        let stream = self.js.get_stream(&self.stream).await.unwrap();
        match stream
            .get_consumer::<async_nats::jetstream::consumer::pull::Config>(DURABLE)
            .await
        {
            Ok(consumer) => {
                let mut consumer: PullConsumer = consumer;
                let info = consumer.info().await.unwrap();
                info.num_pending + info.num_ack_pending as u64
            }
            Err(_) => self.messages(&self.stream).await.len() as u64,
        }
    }

    async fn cleanup(self) {
        Fixture::cleanup(self).await
    }
}

broker_suite!(Fixture);

#[tokio::test]
async fn a_published_row_arrives_with_its_message_id_and_headers() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = NatsPublisher::from_client(fx.client.clone());
    publisher
        .publish(&row(&fx.subject, "order-1"))
        .await
        .unwrap();
    let results = publisher
        .publish_all(&[row(&fx.subject, "order-2"), row(&fx.subject, "order-3")])
        .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let got = fx.messages(&fx.stream).await;
    let ids: Vec<_> = got
        .iter()
        .map(|m| header(m, MSG_ID_HEADER).unwrap())
        .collect();
    assert_eq!(ids, ["order-1", "order-2", "order-3"]);
    assert_eq!(header(&got[0], "tenant"), Some("acme"));
    assert_eq!(&got[0].payload[..], b"payload of order-1");
    let nowhere = publisher
        .publish(&row("dedup.nobody.listens", "order-4"))
        .await;
    assert!(nowhere.is_err(), "a subject no stream captures is not Ok");
    fx.cleanup().await;
}

#[tokio::test]
async fn a_message_older_than_the_floor_by_its_stream_time_is_dead_lettered_unhandled() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    NatsPublisher::from_client(fx.client.clone())
        .publish(&row(&fx.subject, "old"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (runs, calls) = (Runs::default(), Arc::new(AtomicU32::new(0)));
    let handler = counting(
        &Arc::new(MemoryStore::new()),
        InboxConfig::default(),
        &runs,
        &calls,
        Duration::ZERO,
    );
    let floor = ConsumerConfig {
        max_age: Some(Duration::from_millis(200)),
        ..config()
    };
    let (stop, signal) = shutdown();
    let task = tokio::spawn(fx.consumer(floor).run(handler, signal));
    let dead = fx.wait_for_dead(1).await;
    stop.shut_down();
    let stats = task.await.unwrap().unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(header(&dead[0], MSG_ID_HEADER), Some("old"));
    let reason = header(&dead[0], DEAD_LETTER_REASON).unwrap();
    assert!(reason.starts_with("older than"), "{reason}");
    assert_eq!(stats.refused, 1, "{stats:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    fx.cleanup().await;
}

/// A publisher's publish timeout (10 s by default) fits a relay's default 30 s hold; a
/// 60 s one is refused by the relay.
#[tokio::test]
async fn a_relay_refuses_a_nats_publisher_whose_publish_timeout_outlasts_its_hold() {
    let Some(url) = dedup_conformance::server_url("DEDUP_NATS_URL") else {
        return;
    };
    let client = async_nats::connect(url).await.unwrap();
    let default = NatsPublisher::from_client(client.clone());
    let slow = NatsPublisher::from_client(client).publish_timeout(Duration::from_secs(60));
    support::relay_time::assert_relay_checks_timeout(
        Arc::new(default),
        Arc::new(slow),
        Duration::from_secs(60),
    )
    .await;
}
