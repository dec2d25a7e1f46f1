//! The broker the story runs on, RabbitMQ ([`super::rabbit`]) or Kafka ([`super::kafka`]):
//! what the roles and the run ask of it, each answered by that broker's module.

use std::sync::Arc;

use dedup_brokers::{ConsumerStats, Handle, Shutdown};
use dedup_core::outbox::Publisher;

use super::{BoxError, Names, kafka, rabbit};

/// Which broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BrokerKind {
    /// RabbitMQ (durable queues, publisher confirms).
    Rabbitmq,
    /// Kafka (topics, consumer groups, the idempotent producer).
    Kafka,
}

impl BrokerKind {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BrokerKind::Rabbitmq => "rabbitmq",
            BrokerKind::Kafka => "kafka",
        }
    }
}

/// A broker and its address.
#[derive(Clone, Debug)]
pub struct Broker {
    /// Which one.
    pub kind: BrokerKind,
    /// RabbitMQ: the AMQP URL; Kafka: the bootstrap servers.
    pub url: String,
}

/// Whether the publisher's connection is lost for good (the relay then exits, so a
/// supervisor starts it on a fresh one).
pub type Lost = Box<dyn Fn() -> bool + Send + Sync>;

impl Broker {
    /// The destination of outbox rows to `endpoint` (a queue or topic of [`Names`]).
    pub fn destination(&self, endpoint: &str) -> String {
        match self.kind {
            BrokerKind::Rabbitmq => rabbit::destination(endpoint),
            BrokerKind::Kafka => kafka::destination(endpoint),
        }
    }

    /// Make the run's queues or topics (doing it again changes nothing).
    pub async fn prepare(&self, names: &Names) -> Result<(), BoxError> {
        match self.kind {
            BrokerKind::Rabbitmq => rabbit::prepare(&self.url, names).await.map(drop),
            BrokerKind::Kafka => kafka::prepare(&self.url, names).await,
        }
    }

    /// The relay's publisher, and how to tell its connection is lost.
    pub async fn publisher(&self, names: &Names) -> Result<(Arc<dyn Publisher>, Lost), BoxError> {
        match self.kind {
            BrokerKind::Rabbitmq => rabbit::publisher(&self.url, names).await,
            BrokerKind::Kafka => kafka::publisher(&self.url),
        }
    }

    /// Consume `endpoint` with `handler` until `shutdown` (or a lost connection: an error).
    pub async fn consume<H: Handle>(
        &self,
        names: &Names,
        endpoint: &str,
        handler: H,
        shutdown: Shutdown,
    ) -> Result<ConsumerStats, BoxError> {
        match self.kind {
            BrokerKind::Rabbitmq => {
                rabbit::consume(&self.url, names, endpoint, handler, shutdown).await
            }
            BrokerKind::Kafka => kafka::consume(&self.url, endpoint, handler, shutdown).await,
        }
    }

    /// Remove the run's queues or topics.
    pub async fn cleanup(&self, names: &Names) -> Result<(), BoxError> {
        match self.kind {
            BrokerKind::Rabbitmq => rabbit::cleanup(&self.url, names).await,
            BrokerKind::Kafka => kafka::cleanup(&self.url, names).await,
        }
    }

    /// Print (to standard error) what the broker holds of the run, when orders were lost.
    pub async fn explain(&self, names: &Names) {
        match self.kind {
            BrokerKind::Rabbitmq => rabbit::explain(&self.url, names).await,
            BrokerKind::Kafka => kafka::explain(&self.url, names).await,
        }
    }
}
