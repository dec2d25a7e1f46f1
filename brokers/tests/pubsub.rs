//! The Pub/Sub publisher and consumer against Google's Pub/Sub emulator
//! (`DEDUP_PUBSUB_EMULATOR_HOST`, `host:port`).

mod suite;
mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dedup_brokers::pubsub::gcloud_gax::conn::Environment;
use dedup_brokers::pubsub::gcloud_gax::retry::RetrySetting;
use dedup_brokers::pubsub::gcloud_googleapis::pubsub::v1::{
    ModifyAckDeadlineRequest, PubsubMessage, PullRequest,
};
use dedup_brokers::pubsub::gcloud_pubsub::client::{Client, ClientConfig};
use dedup_brokers::pubsub::gcloud_pubsub::subscription::SubscriptionConfig;
use dedup_brokers::pubsub::{MESSAGE_ID_ATTRIBUTE, PubSubConsumer, PubSubPublisher};
use dedup_brokers::{ConsumerConfig, DEAD_LETTER_REASON, Shutdown, shutdown};
use dedup_core::outbox::Publisher;
use dedup_core::{InboxConfig, MemoryStore};
use suite::broken::{DropsFailureHeaders, must_fail};
use suite::{BrokerFactory, DeadLetter, broker_suite, clauses};
use support::{Runs, all_once, config, counting, row};

/// The subscriptions' ack deadline: the emulator's (and Pub/Sub's) least.
const ACK_DEADLINE: i32 = 10;

struct Fixture {
    client: Client,
    topic: String,
    subscription: String,
    dead: String,
    dead_subscription: String,
}

/// A message as read back from a subscription.
#[derive(Debug)]
struct Message {
    attributes: HashMap<String, String>,
    data: Vec<u8>,
}

impl Message {
    fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes.get(name).map(String::as_str)
    }
}

async fn client() -> Option<Client> {
    let host = dedup_conformance::server_url("DEDUP_PUBSUB_EMULATOR_HOST")?;
    let config = ClientConfig {
        environment: Environment::Emulator(host),
        project_id: Some("dedup-test".into()),
        ..ClientConfig::default()
    };
    Some(Client::new(config).await.unwrap())
}

fn no_retry() -> Option<RetrySetting> {
    Some(RetrySetting {
        take: 0,
        codes: Vec::new(),
        ..RetrySetting::default()
    })
}

impl Fixture {
    /// A fresh topic with a subscription, and a dead-letter topic with one.
    async fn new() -> Option<Fixture> {
        let client = client().await?;
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let fx = Fixture {
            client,
            topic: format!("dedup-{tag}"),
            subscription: format!("dedup-{tag}-sub"),
            dead: format!("dedup-{tag}-dead"),
            dead_subscription: format!("dedup-{tag}-dead-sub"),
        };
        for (topic, subscription) in [
            (&fx.topic, &fx.subscription),
            (&fx.dead, &fx.dead_subscription),
        ] {
            fx.client.create_topic(topic, None, None).await.unwrap();
            fx.subscribe(topic, subscription).await;
        }
        Some(fx)
    }

    async fn subscribe(&self, topic: &str, subscription: &str) {
        let settings = SubscriptionConfig {
            ack_deadline_seconds: ACK_DEADLINE,
            ..SubscriptionConfig::default()
        };
        self.client
            .create_subscription(subscription, topic, settings, None)
            .await
            .unwrap();
    }

    fn consumer(&self, config: ConsumerConfig) -> PubSubConsumer {
        PubSubConsumer::new(self.client.clone(), &self.subscription, &self.dead, config)
    }

    /// Every message `subscription` has ready now (not held by a consumer), given back at
    /// once after the look.
    async fn ready(&self, subscription: &str) -> Vec<Message> {
        let sub = self.client.subscription(subscription);
        let subscriber = sub.get_client();
        let name = sub.fully_qualified_name().to_owned();
        let (mut out, mut ack_ids) = (Vec::new(), Vec::new());
        loop {
            #[allow(deprecated)]
            let request = PullRequest {
                subscription: name.clone(),
                return_immediately: true,
                max_messages: 1000,
            };
            let got = subscriber
                .pull(request, no_retry())
                .await
                .unwrap()
                .into_inner()
                .received_messages;
            if got.is_empty() {
                break;
            }
            for r in got {
                let m = r.message.unwrap();
                ack_ids.push(r.ack_id);
                out.push(Message {
                    attributes: m.attributes,
                    data: m.data.to_vec(),
                });
            }
        }
        if !ack_ids.is_empty() {
            let request = ModifyAckDeadlineRequest {
                subscription: name,
                ack_ids,
                ack_deadline_seconds: 0,
            };
            subscriber.modify_ack_deadline(request, None).await.unwrap();
        }
        out
    }

    async fn publish_raw(&self, data: &[u8], attributes: HashMap<String, String>) {
        let message = PubsubMessage {
            data: data.to_vec().into(),
            attributes,
            ..PubsubMessage::default()
        };
        self.client
            .topic(&self.topic)
            .new_publisher(None)
            .publish_immediately(vec![message], None)
            .await
            .unwrap();
    }

    async fn cleanup(self) {
        for s in [&self.subscription, &self.dead_subscription] {
            let _ = self.client.subscription(s).delete(None).await;
        }
        for t in [&self.topic, &self.dead] {
            let _ = self.client.topic(t).delete(None).await;
        }
    }
}

#[async_trait]
impl BrokerFactory for Fixture {
    type Source = PubSubConsumer;

    async fn new() -> Option<Self> {
        Fixture::new().await
    }

    async fn publish(&self, ids: &[String]) {
        let publisher = PubSubPublisher::new(self.client.clone());
        for id in ids {
            publisher.publish(&row(&self.topic, id)).await.unwrap();
        }
    }

    async fn publish_without_id(&self, payload: &[u8]) {
        self.publish_raw(payload, HashMap::new()).await;
    }

    async fn source(&self, _worker: &str, config: &ConsumerConfig) -> PubSubConsumer {
        self.consumer(config.clone())
    }

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        self.ready(&self.dead_subscription)
            .await
            .iter()
            .map(|m| DeadLetter {
                message_id: m.attribute(MESSAGE_ID_ATTRIBUTE).map(str::to_owned),
                payload: m.data.clone(),
                reason: m.attribute(DEAD_LETTER_REASON).map(str::to_owned),
                headers: m.attributes.clone().into_iter().collect(),
            })
            .collect()
    }

    /// Messages of the subscription ready now (a message held by a running consumer, or
    /// waiting out a retry's ack deadline, is not counted).
    async fn outstanding(&self) -> u64 {
        self.ready(&self.subscription).await.len() as u64
    }

    async fn cleanup(self) {
        Fixture::cleanup(self).await
    }
}

broker_suite!(Fixture);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_catches_an_adapter_that_drops_the_failure_headers() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let clause = clauses::a_dead_lettered_copy_carries_its_cause(DropsFailureHeaders(fx));
    must_fail("an adapter dropping the failure headers", clause).await;
}

#[tokio::test]
async fn a_published_row_arrives_with_its_message_id_and_attributes() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = PubSubPublisher::new(fx.client.clone());
    publisher.publish(&row(&fx.topic, "order-1")).await.unwrap();
    let results = publisher
        .publish_all(&[row(&fx.topic, "order-2"), row(&fx.topic, "order-3")])
        .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let got = fx.ready(&fx.subscription).await;
    let mut ids: Vec<_> = got
        .iter()
        .map(|m| m.attribute(MESSAGE_ID_ATTRIBUTE).unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["order-1", "order-2", "order-3"]);
    let first = got
        .iter()
        .find(|m| m.attribute(MESSAGE_ID_ATTRIBUTE) == Some("order-1"))
        .unwrap();
    assert_eq!(first.attribute("tenant"), Some("acme"));
    assert_eq!(first.data, b"payload of order-1");
    fx.cleanup().await;
}

#[tokio::test]
async fn a_publish_the_server_refuses_is_an_error_never_ok() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let publisher = PubSubPublisher::new(fx.client.clone());
    let missing = format!("{}-missing", fx.topic);
    let result = publisher.publish(&row(&missing, "order-1")).await;
    let err = result.expect_err("a topic that does not exist");
    assert!(format!("{err}").contains("-missing"), "{err}");
    let results = publisher
        .publish_all(&[row(&fx.topic, "order-2"), row(&missing, "order-3")])
        .await;
    assert!(results[0].is_ok(), "{results:?}");
    assert!(results[1].is_err(), "{results:?}");
    fx.cleanup().await;
}

/// A handler running longer than the subscription's ack deadline (10 s): the consumer
/// keeps extending it, so a second consumer of the subscription never gets the message,
/// and it is handled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ack_deadline_is_extended_while_a_slow_handler_runs() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    fx.publish(&["slow".to_string()]).await;
    let store = Arc::new(MemoryStore::new());
    let (runs, calls_a, calls_b) = (
        Runs::default(),
        Arc::new(AtomicU32::new(0)),
        Arc::new(AtomicU32::new(0)),
    );
    let slow = counting(
        &store,
        InboxConfig::default(),
        &runs,
        &calls_a,
        Duration::from_secs(u64::try_from(ACK_DEADLINE).unwrap() + 4),
    );
    let (stop, signal) = shutdown();
    let consumer_a = fx.consumer(config());
    let health = consumer_a.health();
    let a = tokio::spawn(consumer_a.run(slow, signal.clone()));
    // A pulls within 50 ms; from then on it holds the message (none ready).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(fx.outstanding().await, 0, "A holds the message");
    let held = health.snapshot();
    assert!(held.connected, "A is connected while it runs: {held:?}");
    assert_eq!(
        held.in_flight, 1,
        "A's health counts the held message: {held:?}"
    );
    let other = counting(
        &store,
        InboxConfig::default(),
        &runs,
        &calls_b,
        Duration::ZERO,
    );
    let b = tokio::spawn(fx.consumer(config()).run(other, signal));
    for _ in 0..600 {
        if calls_a.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.shut_down();
    let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
    let after = health.snapshot();
    assert!(
        after.last_settle.is_some() && after.in_flight == 0,
        "{after:?}"
    );
    assert_eq!(calls_a.load(Ordering::SeqCst), 1, "A finished it: {a:?}");
    assert_eq!(
        calls_b.load(Ordering::SeqCst),
        0,
        "B never got it while A held it: {b:?}"
    );
    assert_eq!((a.processed, b.processed + b.duplicates), (1, 0));
    assert!(all_once(&runs, 1), "{runs:?}");
    assert_eq!(fx.outstanding().await, 0);
    fx.cleanup().await;
}

async fn refusal(consumer: PubSubConsumer) -> dedup_brokers::BrokerError {
    let calls = Arc::new(AtomicU32::new(0));
    let handler = counting(
        &Arc::new(MemoryStore::new()),
        InboxConfig::default(),
        &Runs::default(),
        &calls,
        Duration::ZERO,
    );
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        consumer.run(handler, Shutdown::never()),
    )
    .await
    .expect("run ends by itself");
    let err = result.expect_err("refused at start");
    assert!(!err.is_retryable(), "{err:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    err
}

/// A dead-letter topic that does not exist: `run` refuses to start rather than lose dead
/// letters.
#[tokio::test]
async fn a_missing_dead_letter_topic_is_refused_at_start() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let missing = format!("{}-missing", fx.dead);
    let err = refusal(PubSubConsumer::new(
        fx.client.clone(),
        &fx.subscription,
        &missing,
        config(),
    ))
    .await;
    assert!(format!("{err}").contains("-missing"), "{err}");
    fx.cleanup().await;
}

/// A dead-letter topic nobody subscribes to: Pub/Sub would drop every dead letter, so
/// `run` refuses to start; once a subscription exists, it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_topic_without_a_subscription_is_refused_at_start() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let lonely = format!("{}-lonely", fx.dead);
    fx.client.create_topic(&lonely, None, None).await.unwrap();
    let consumer =
        |config| PubSubConsumer::new(fx.client.clone(), &fx.subscription, &lonely, config);
    let err = refusal(consumer(config())).await;
    let chain = dedup_core::error_chain(&err);
    assert!(chain.contains("no subscription"), "{chain}");
    assert!(chain.contains("-lonely"), "{chain}");

    let lonely_sub = format!("{lonely}-sub");
    fx.subscribe(&lonely, &lonely_sub).await;
    let (stop, signal) = shutdown();
    let task = tokio::spawn(consumer(config()).run(
        counting(
            &Arc::new(MemoryStore::new()),
            InboxConfig::default(),
            &Runs::default(),
            &Arc::new(AtomicU32::new(0)),
            Duration::ZERO,
        ),
        signal,
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !task.is_finished(),
        "it runs once the topic has a subscription"
    );
    stop.shut_down();
    task.await.unwrap().unwrap();
    let _ = fx.client.subscription(&lonely_sub).delete(None).await;
    let _ = fx.client.topic(&lonely).delete(None).await;
    fx.cleanup().await;
}

/// A subscription that does not exist: refused, not retried forever.
#[tokio::test]
async fn a_missing_subscription_is_refused_at_start() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let missing = format!("{}-missing", fx.subscription);
    let err = refusal(PubSubConsumer::new(
        fx.client.clone(),
        &missing,
        &fx.dead,
        config(),
    ))
    .await;
    assert!(dedup_core::error_chain(&err).contains("-missing"), "{err}");
    fx.cleanup().await;
}

/// A publisher's publish timeout (10 s by default) fits a relay's default 30 s hold; a
/// 60 s one is refused by the relay.
#[tokio::test]
async fn a_relay_refuses_a_pubsub_publisher_whose_publish_timeout_outlasts_its_hold() {
    let Some(client) = client().await else {
        return;
    };
    let default = PubSubPublisher::new(client.clone());
    let slow = PubSubPublisher::new(client).publish_timeout(Duration::from_secs(60));
    support::relay_time::assert_relay_checks_timeout(
        Arc::new(default),
        Arc::new(slow),
        Duration::from_secs(60),
    )
    .await;
}
