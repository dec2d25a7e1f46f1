//! Pub/Sub: a topic and its subscription, and a dead-letter topic with one.

use dedup_brokers::ConsumerConfig;
use dedup_brokers::pubsub::gcloud_gax::conn::Environment;
use dedup_brokers::pubsub::gcloud_pubsub::client::{Client, ClientConfig};
use dedup_brokers::pubsub::gcloud_pubsub::subscription::SubscriptionConfig;
use dedup_brokers::pubsub::{PubSubConsumer, PubSubDeadLetters, PubSubPublisher};
use dedup_brokers::replay::DeadLetters;
use dedup_core::outbox::Publisher;

use crate::{Broker, row};

/// The emulator's project.
const PROJECT: &str = "dedup-test";

/// Topics and subscriptions on the emulator at `host`.
pub struct PubSub {
    host: String,
    client: Client,
    topic: String,
    subscription: String,
    dead: String,
    dead_subscription: String,
}

impl PubSub {
    /// Fresh topics and subscriptions on the emulator at `host`.
    pub async fn new(host: String) -> PubSub {
        let config = ClientConfig {
            environment: Environment::Emulator(host.clone()),
            project_id: Some(PROJECT.into()),
            ..ClientConfig::default()
        };
        let tag = uuid::Uuid::new_v4().simple();
        let pubsub = PubSub {
            host,
            client: Client::new(config).await.unwrap(),
            topic: format!("dedup-cli-replay-{tag}"),
            subscription: format!("dedup-cli-replay-{tag}-sub"),
            dead: format!("dedup-cli-replay-{tag}-dead"),
            dead_subscription: format!("dedup-cli-replay-{tag}-dead-sub"),
        };
        let settings = SubscriptionConfig {
            ack_deadline_seconds: 10,
            ..SubscriptionConfig::default()
        };
        for (topic, subscription) in [
            (&pubsub.topic, &pubsub.subscription),
            (&pubsub.dead, &pubsub.dead_subscription),
        ] {
            let client = &pubsub.client;
            client.create_topic(topic, None, None).await.unwrap();
            let made = client.create_subscription(subscription, topic, settings.clone(), None);
            made.await.unwrap();
        }
        pubsub
    }
}

impl Broker for PubSub {
    type Source = PubSubConsumer;

    fn dead_url(&self) -> String {
        format!("pubsub://{PROJECT}?subscription={}", self.dead_subscription)
    }

    /// The binary finds the emulator as every Pub/Sub client does.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![("PUBSUB_EMULATOR_HOST", self.host.clone())]
    }

    /// On this process's client: its environment does not name the emulator.
    async fn dead_letters(&self) -> Box<dyn DeadLetters> {
        let dead = PubSubDeadLetters::new(self.client.clone(), &self.dead_subscription);
        Box::new(dead.await.unwrap())
    }

    fn source(&self, config: ConsumerConfig) -> PubSubConsumer {
        let client = self.client.clone();
        PubSubConsumer::new(client, &self.subscription, &self.dead, config)
    }

    async fn publish(&self, id: &str) {
        let publisher = PubSubPublisher::new(self.client.clone());
        publisher.publish(&row(&self.topic, id)).await.unwrap();
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
