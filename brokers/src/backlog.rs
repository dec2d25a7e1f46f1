//! [`Backlog`]: how many messages wait on the broker for a consumer, as the broker
//! reports it.
//!
//! The console charts it beside the store's flow (`Console::with_backlog`). Each read
//! asks the broker once. Nothing is kept on the consumers' side, and their path is
//! untouched. One implementation per broker that reports it:
//!
//! | broker | implementation | what it counts |
//! |---|---|---|
//! | Kafka | `kafka::KafkaLag` | consumer-group lag: the partitions' end offsets less the group's committed offsets |
//! | RabbitMQ | `rabbitmq::RabbitDepth` | queue depth: the messages ready in the queue |
//! | NATS JetStream | `nats::NatsBacklog` | the durable consumer's messages not yet delivered, and those delivered and not acknowledged |
//! | Redis Streams | `redis_streams::StreamBacklog` | the group's entries not yet delivered, and those delivered and not acknowledged |

use async_trait::async_trait;

use crate::BrokerError;

/// A broker's count of the messages waiting for one consumer.
#[async_trait]
pub trait Backlog: Send + Sync {
    /// What the chart calls it (the queue, topic or stream, and its consumer).
    fn name(&self) -> &str;

    /// What the count is, in a few words (`consumer-group lag`, `queue depth`).
    fn what(&self) -> &'static str;

    /// The count now.
    ///
    /// # Errors
    ///
    /// The broker's error when it cannot be asked, or refuses.
    async fn backlog(&self) -> Result<u64, BrokerError>;
}
