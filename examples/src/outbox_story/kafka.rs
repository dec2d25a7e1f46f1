//! The story on Kafka: the run's queues are topics (one partition each, with a dead-letter
//! topic `<topic>-dead`), the relay publishes with the idempotent producer, consumers are
//! group members (group `<topic>-group`, inbox consumer name the topic, as on RabbitMQ).
//! librdkafka reconnects by itself: the relay never reports its connection lost.

use std::sync::Arc;
use std::time::Duration;

use dedup_brokers::kafka::{KafkaConsumer, KafkaPublisher};
use dedup_brokers::{ConsumerConfig, ConsumerStats, Handle, Shutdown};
use dedup_core::outbox::Publisher;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;

use super::broker::Lost;
use super::{BoxError, Names};

/// A topic is its own destination.
pub fn destination(topic: &str) -> String {
    topic.to_owned()
}

fn dead_letters(topic: &str) -> String {
    format!("{topic}-dead")
}

fn topics(names: &Names) -> Vec<String> {
    [&names.orders_queue, &names.invoices_queue]
        .into_iter()
        .flat_map(|t| [t.clone(), dead_letters(t)])
        .collect()
}

fn admin(brokers: &str) -> Result<AdminClient<DefaultClientContext>, BoxError> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?)
}

/// Create the run's topics and their dead-letter topics (one partition each); existing
/// ones are kept.
pub async fn prepare(brokers: &str, names: &Names) -> Result<(), BoxError> {
    let topics = topics(names);
    let new: Vec<_> = topics
        .iter()
        .map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(1)))
        .collect();
    for result in admin(brokers)?
        .create_topics(&new, &AdminOptions::new())
        .await?
    {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(format!("creating topic {topic}: {code}").into()),
        }
    }
    Ok(())
}

/// The idempotent producer; never reported lost (librdkafka reconnects). Its messages time
/// out after 1.5 s, so a call is over within 3 s: within the relay's short hold
/// (`roles.rs`).
pub fn publisher(brokers: &str) -> Result<(Arc<dyn Publisher>, Lost), BoxError> {
    let mut settings = ClientConfig::new();
    settings
        .set("bootstrap.servers", brokers)
        .set("message.timeout.ms", "1500");
    let publisher = KafkaPublisher::from_config(&settings)?;
    Ok((Arc::new(publisher), Box::new(|| false)))
}

/// Consume `topic` in group `<topic>-group`, keys under the topic's name.
pub async fn consume<H: Handle>(
    brokers: &str,
    topic: &str,
    handler: H,
    shutdown: Shutdown,
) -> Result<ConsumerStats, BoxError> {
    let config = ConsumerConfig {
        consumer: Some(topic.to_owned()),
        in_flight: 8,
        retry_delay: Duration::from_millis(300),
        ..ConsumerConfig::default()
    };
    let group = format!("{topic}-group");
    // A short session: a SIGKILLed member's partition moves on after 2 s (and Tansu
    // completes a join after about half the session timeout).
    let consumer = KafkaConsumer::new(brokers, group, topic, dead_letters(topic), config)
        .set("session.timeout.ms", "2000")
        .set("heartbeat.interval.ms", "300");
    Ok(consumer.run(handler, shutdown).await?)
}

/// Delete the run's topics.
pub async fn cleanup(brokers: &str, names: &Names) -> Result<(), BoxError> {
    let topics = topics(names);
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    admin(brokers)?
        .delete_topics(&names, &AdminOptions::new())
        .await?;
    Ok(())
}

/// Kafka keeps records after they are consumed: nothing to count here beyond the outbox
/// and inbox (printed by the run).
pub async fn explain(brokers: &str, names: &Names) {
    eprintln!(
        "Kafka {brokers}: topics {:?} (records stay after consumption; see the inbox records above)",
        topics(names)
    );
}
