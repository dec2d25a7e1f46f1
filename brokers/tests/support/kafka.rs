//! Kafka set-up the Kafka tests share: a client, fresh topics, and a reader of a topic.

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

/// A client configuration for the cluster at `brokers`.
pub fn client(brokers: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers);
    c
}

/// Creates `topics`, one partition each. Panics if one exists or cannot be made.
pub async fn create_topics(brokers: &str, topics: &[&str]) {
    create_partitioned(brokers, topics, 1).await;
}

/// Creates `topics`, `partitions` each. Panics if one exists or cannot be made.
pub async fn create_partitioned(brokers: &str, topics: &[&str], partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = client(brokers).create().unwrap();
    let new: Vec<_> = topics
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
        .collect();
    for created in admin
        .create_topics(&new, &AdminOptions::new())
        .await
        .unwrap()
    {
        created.unwrap();
    }
}

/// A consumer in group `group` that reads `topic`'s partition 0 from its start. It commits
/// nothing. It blocks: call it from `spawn_blocking`.
pub fn reader(brokers: &str, group: &str, topic: &str) -> BaseConsumer {
    let consumer: BaseConsumer = client(brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    consumer
}

/// `record`'s headers, values as text (lossy), in order.
pub fn headers(record: &BorrowedMessage<'_>) -> Vec<(String, String)> {
    let Some(headers) = record.headers() else {
        return Vec::new();
    };
    headers
        .iter()
        .map(|h| {
            let v = h.value.map(|v| String::from_utf8_lossy(v).into_owned());
            (h.key.to_owned(), v.unwrap_or_default())
        })
        .collect()
}
