//! Replay from a subscription of a Pub/Sub dead-letter topic, against Google's Pub/Sub
//! emulator (`DEDUP_PUBSUB_EMULATOR_HOST`): each copy goes back to the topic its
//! subscription reads, and runs once.

mod replay_suite;
mod support;

use async_trait::async_trait;
use dedup_brokers::pubsub::gcloud_gax::conn::Environment;
use dedup_brokers::pubsub::gcloud_googleapis::pubsub::v1::{
    AcknowledgeRequest, PullRequest, ReceivedMessage,
};
use dedup_brokers::pubsub::gcloud_pubsub::client::{Client, ClientConfig};
use dedup_brokers::pubsub::gcloud_pubsub::subscription::SubscriptionConfig;
use dedup_brokers::pubsub::{ORIGIN_ATTRIBUTE, PubSubConsumer, PubSubDeadLetters, PubSubPublisher};
use dedup_brokers::replay::{self, DeadLetters, Pick};
use dedup_brokers::{ConsumerConfig, FAILURE_CONSUMER_HEADER};
use dedup_core::outbox::{OutboxRow, Publisher};
use replay_suite::{ReplayBroker, World, replay_scenarios, strings};
use support::row;

const PROJECT: &str = "dedup-test";

struct Fixture {
    client: Client,
    topic: String,
    subscription: String,
    /// A second subscription of the topic: it keeps a copy of what is published.
    tap: String,
    dead: String,
    dead_subscription: String,
}

impl Fixture {
    /// Every message the tap subscription holds now, acknowledged.
    async fn tapped(&self) -> Vec<ReceivedMessage> {
        let sub = self.client.subscription(&self.tap);
        let subscriber = sub.get_client();
        let name = sub.fully_qualified_name().to_owned();
        #[allow(deprecated)]
        let request = PullRequest {
            subscription: name.clone(),
            return_immediately: true,
            max_messages: 100,
        };
        let got = subscriber.pull(request, None).await.unwrap().into_inner();
        let ack_ids = got.received_messages.iter().map(|r| r.ack_id.clone());
        let request = AcknowledgeRequest {
            subscription: name,
            ack_ids: ack_ids.collect(),
        };
        if !request.ack_ids.is_empty() {
            subscriber.acknowledge(request, None).await.unwrap();
        }
        got.received_messages
    }
}

#[async_trait]
impl ReplayBroker for Fixture {
    type Source = PubSubConsumer;
    type Letters = PubSubDeadLetters;

    /// A topic with the consumer's subscription and a tap, a dead-letter topic with one.
    async fn new() -> Option<Self> {
        let host = dedup_conformance::server_url("DEDUP_PUBSUB_EMULATOR_HOST")?;
        let config = ClientConfig {
            environment: Environment::Emulator(host),
            project_id: Some(PROJECT.into()),
            ..ClientConfig::default()
        };
        let client = Client::new(config).await.unwrap();
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let fx = Fixture {
            client,
            topic: format!("dedup-replay-{tag}"),
            subscription: format!("dedup-replay-{tag}-sub"),
            tap: format!("dedup-replay-{tag}-tap"),
            dead: format!("dedup-replay-{tag}-dead"),
            dead_subscription: format!("dedup-replay-{tag}-dead-sub"),
        };
        let settings = SubscriptionConfig {
            ack_deadline_seconds: 10,
            ..SubscriptionConfig::default()
        };
        for topic in [&fx.topic, &fx.dead] {
            fx.client.create_topic(topic, None, None).await.unwrap();
        }
        for (subscription, topic) in [
            (&fx.subscription, &fx.topic),
            (&fx.tap, &fx.topic),
            (&fx.dead_subscription, &fx.dead),
        ] {
            fx.client
                .create_subscription(subscription, topic, settings.clone(), None)
                .await
                .unwrap();
        }
        Some(fx)
    }

    fn consumer(&self) -> String {
        self.subscription.clone()
    }

    async fn publish(&self, ids: &[String]) {
        let publisher = PubSubPublisher::new(self.client.clone());
        for id in ids {
            let keyed = OutboxRow {
                ordering_key: Some(format!("key-of-{id}")),
                ..row(&self.topic, id)
            };
            publisher.publish(&keyed).await.unwrap();
        }
    }

    async fn source(&self, config: &ConsumerConfig) -> PubSubConsumer {
        PubSubConsumer::new(
            self.client.clone(),
            &self.subscription,
            &self.dead,
            config.clone(),
        )
    }

    async fn dead_letters(&self) -> PubSubDeadLetters {
        PubSubDeadLetters::new(self.client.clone(), &self.dead_subscription)
            .await
            .unwrap()
    }

    async fn cleanup(self) {
        for s in [&self.subscription, &self.tap, &self.dead_subscription] {
            let _ = self.client.subscription(s).delete(None).await;
        }
        for t in [&self.topic, &self.dead] {
            let _ = self.client.topic(t).delete(None).await;
        }
    }
}

replay_scenarios!(Fixture);

/// A copy's origin is the topic its subscription reads; the replayed message carries its
/// message id, payload, ordering key and own attributes, not the failure's nor the
/// origin's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_goes_back_to_the_topic_of_its_subscription() {
    let Some(fx) = <Fixture as ReplayBroker>::new().await else {
        return;
    };
    let w = World::start(fx).await;
    w.dead_letter(&strings(&["bad-1"])).await;
    assert_eq!(w.fx.tapped().await.len(), 1, "the tap got the original");
    let mut dead = w.fx.dead_letters().await;
    let letters = dead.take(10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let topic = format!("projects/{PROJECT}/topics/{}", w.fx.topic);
    assert_eq!(letters[0].origin, topic);
    assert_eq!(letters[0].key.as_deref(), Some(&b"key-of-bad-1"[..]));
    let consumer = letters[0].header(FAILURE_CONSUMER_HEADER);
    assert_eq!(consumer, Some(w.fx.subscription.as_str()));
    dead.give_back().await.unwrap();
    drop(dead);

    let report = w.replay(&Pick::All).await;
    assert_eq!(report.replayed, ["bad-1"], "{report:?}");
    let again = w.fx.tapped().await;
    assert_eq!(again.len(), 1, "the tap got the replayed message");
    let message = again[0].message.as_ref().unwrap();
    assert_eq!(message.data, "payload of bad-1");
    assert_eq!(
        message.ordering_key, "key-of-bad-1",
        "the ordering key is kept"
    );
    let attributes = &message.attributes;
    assert_eq!(
        attributes.get("message-id").map(String::as_str),
        Some("bad-1")
    );
    assert_eq!(attributes.get("tenant").map(String::as_str), Some("acme"));
    for name in attributes.keys() {
        let bookkeeping = replay::is_dead_letter_header(name) || name == ORIGIN_ATTRIBUTE;
        assert!(!bookkeeping, "{name}");
    }
    w.finish().await;
}

/// `replay::open` needs `?subscription=`; a missing subscription is refused.
#[tokio::test]
async fn a_missing_subscription_is_refused() {
    let Some(fx) = <Fixture as ReplayBroker>::new().await else {
        return;
    };
    let missing = replay::open(&format!("pubsub://{PROJECT}")).await.err();
    let missing = missing.expect("no subscription named").to_string();
    assert!(missing.contains("?subscription="), "{missing}");
    let absent = PubSubDeadLetters::new(fx.client.clone(), "dedup-no-such-subscription").await;
    let refused = absent.expect_err("no such subscription");
    assert!(
        matches!(refused, dedup_brokers::BrokerError::Refused { .. }),
        "{refused:?}"
    );
    fx.cleanup().await;
}
