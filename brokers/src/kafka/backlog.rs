//! [`KafkaLag`]: a consumer group's lag on a topic, for the console's flow charts.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::errors::classify;
use crate::BrokerError;
use crate::backlog::Backlog;

/// How long one of the broker calls of a read may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A consumer group's lag on a topic: over its partitions, the end offset less the
/// group's committed offset (less the start offset where the group committed none).
///
/// It reads as an admin tool does: the topic's metadata, the group's committed offsets
/// (`OffsetFetch`) and each partition's watermarks. It never joins the group, so the
/// group's members are not rebalanced. librdkafka's calls block: they run on tokio's
/// blocking threads.
pub struct KafkaLag {
    name: String,
    topic: String,
    client: Arc<BaseConsumer>,
}

impl std::fmt::Debug for KafkaLag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaLag")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl KafkaLag {
    /// The lag of `group` on `topic`, at the brokers `brokers` (`host:port,...`).
    ///
    /// # Errors
    ///
    /// [`BrokerError::Refused`] when librdkafka refuses the settings.
    pub fn new(brokers: &str, topic: &str, group: &str) -> Result<Self, BrokerError> {
        let client: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("allow.auto.create.topics", "false")
            .create()
            .map_err(|e| classify("creating the Kafka client of a group's lag", e))?;
        Ok(KafkaLag {
            name: format!("{topic} ({group})"),
            topic: topic.to_owned(),
            client: Arc::new(client),
        })
    }
}

/// The lag of the client's group on `topic`, read with blocking calls.
fn lag(client: &BaseConsumer, topic: &str) -> Result<u64, BrokerError> {
    let metadata = client
        .fetch_metadata(Some(topic), CALL_TIMEOUT)
        .map_err(|e| classify(format!("the metadata of topic {topic}"), e))?;
    let mut partitions = TopicPartitionList::new();
    for t in metadata.topics() {
        if let Some(e) = t.error() {
            let code = RDKafkaErrorCode::from(e);
            let (context, e) = (format!("topic {topic}"), KafkaError::MetadataFetch(code));
            // No such topic: asking again will not make one.
            return Err(match code {
                RDKafkaErrorCode::UnknownTopicOrPartition => BrokerError::refused(context, e),
                _ => classify(context, e),
            });
        }
        for p in t.partitions() {
            partitions.add_partition(topic, p.id());
        }
    }
    let committed = client
        .committed_offsets(partitions, CALL_TIMEOUT)
        .map_err(|e| classify(format!("the committed offsets on topic {topic}"), e))?;
    let mut total = 0u64;
    for p in committed.elements() {
        let (low, high) = client
            .fetch_watermarks(topic, p.partition(), CALL_TIMEOUT)
            .map_err(|e| classify(format!("the offsets of {topic}/{}", p.partition()), e))?;
        let from = match p.offset() {
            Offset::Offset(o) => o,
            _ => low,
        };
        total += u64::try_from(high - from).unwrap_or(0);
    }
    Ok(total)
}

#[async_trait]
impl Backlog for KafkaLag {
    fn name(&self) -> &str {
        &self.name
    }

    fn what(&self) -> &'static str {
        "consumer-group lag"
    }

    async fn backlog(&self) -> Result<u64, BrokerError> {
        let (client, topic) = (Arc::clone(&self.client), self.topic.clone());
        tokio::task::spawn_blocking(move || lag(&client, &topic))
            .await
            .map_err(|e| BrokerError::broker("reading a group's lag", e))?
    }
}
