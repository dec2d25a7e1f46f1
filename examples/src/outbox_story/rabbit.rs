//! The story on RabbitMQ: two durable queues, a relay publishing with confirms on a
//! connection it watches, consumers over a channel (a lost connection ends them, and the
//! chaos run starts the worker again).

use std::sync::Arc;
use std::time::Duration;

use dedup_brokers::rabbitmq::{RabbitConsumer, RabbitPublisher};
use dedup_brokers::{ConsumerConfig, ConsumerStats, Handle, Shutdown};
use dedup_core::outbox::Publisher;
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};

use super::broker::Lost;
use super::{BoxError, Names};

/// `/queue`: the default exchange, routing to the queue.
pub fn destination(queue: &str) -> String {
    format!("/{queue}")
}

fn queues(names: &Names) -> [&String; 2] {
    [&names.orders_queue, &names.invoices_queue]
}

/// Connect to RabbitMQ and declare the run's two durable queues.
pub async fn prepare(amqp: &str, names: &Names) -> Result<Connection, BoxError> {
    let connection = Connection::connect(amqp, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    for queue in queues(names) {
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(queue.as_str().into(), durable, FieldTable::default())
            .await?;
    }
    Ok(connection)
}

/// A publisher on a fresh connection, lost when that connection is.
pub async fn publisher(amqp: &str, names: &Names) -> Result<(Arc<dyn Publisher>, Lost), BoxError> {
    let connection = prepare(amqp, names).await?;
    // Within the relay's short hold (`roles.rs`).
    let publisher = RabbitPublisher::new(&connection)
        .await?
        .confirm_timeout(Duration::from_secs(3));
    Ok((
        Arc::new(publisher),
        Box::new(move || !connection.status().connected()),
    ))
}

/// Consume `queue` over a channel of a fresh connection.
pub async fn consume<H: Handle>(
    amqp: &str,
    names: &Names,
    queue: &str,
    handler: H,
    shutdown: Shutdown,
) -> Result<ConsumerStats, BoxError> {
    let connection = prepare(amqp, names).await?;
    let config = ConsumerConfig {
        in_flight: 8,
        retry_delay: Duration::from_millis(300),
        ..ConsumerConfig::default()
    };
    let consumer = RabbitConsumer::new(connection.create_channel().await?, queue, config);
    Ok(consumer.run(handler, shutdown).await?)
}

/// Delete the run's queues.
pub async fn cleanup(amqp: &str, names: &Names) -> Result<(), BoxError> {
    let connection = Connection::connect(amqp, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    for queue in queues(names) {
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await?;
    }
    Ok(())
}

/// The queues' depths and consumers.
pub async fn explain(amqp: &str, names: &Names) {
    let Ok(connection) = Connection::connect(amqp, ConnectionProperties::default()).await else {
        return;
    };
    let Ok(channel) = connection.create_channel().await else {
        return;
    };
    for queue in queues(names) {
        let options = QueueDeclareOptions {
            passive: true,
            durable: true,
            ..Default::default()
        };
        if let Ok(q) = channel
            .queue_declare(queue.as_str().into(), options, Default::default())
            .await
        {
            eprintln!(
                "queue {queue}: {} ready, {} consumers",
                q.message_count(),
                q.consumer_count()
            );
        }
    }
}
