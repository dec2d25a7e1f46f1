//! [`KafkaPending`]: one record and how it settles: its offset marked settled (and the
//! partition's settled prefix committed), after a retried or dead-lettered copy was
//! written.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

use super::errors::classify;
use super::offsets::{Offsets, Partition, Rebalancing};
use super::{MESSAGE_ID_HEADER, ORIGIN_HEADER, RETRIES_HEADER};
use crate::{Action, BrokerError, DEAD_LETTER_REASON, Delivery, Pending, Shutdown};

/// How long a copy may wait for its delivery report.
const COPY_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a consumer's retried and dead-lettered copies go, and the producer writing them.
pub(crate) struct Copies {
    pub(crate) producer: FutureProducer,
    pub(crate) retry_topic: String,
    pub(crate) dead_letter_topic: String,
}

/// One Kafka record a [`KafkaConsumer`](super::KafkaConsumer) fetched.
pub struct KafkaPending {
    delivery: Delivery,
    key: Option<Vec<u8>>,
    origin: String,
    partition: Partition,
    offset: i64,
    generation: Option<u64>,
    offsets: Offsets,
    consumer: Arc<StreamConsumer<Rebalancing>>,
    copies: Arc<Copies>,
}

impl std::fmt::Debug for KafkaPending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPending")
            .field("delivery", &self.delivery)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl KafkaPending {
    #[allow(clippy::too_many_arguments)] // one private constructor, called once
    pub(crate) fn new(
        delivery: Delivery,
        key: Option<Vec<u8>>,
        origin: String,
        partition: Partition,
        offset: i64,
        generation: Option<u64>,
        offsets: Offsets,
        consumer: Arc<StreamConsumer<Rebalancing>>,
        copies: Arc<Copies>,
    ) -> Self {
        KafkaPending {
            delivery,
            key,
            origin,
            partition,
            offset,
            generation,
            offsets,
            consumer,
            copies,
        }
    }

    /// Write a copy of the record to `topic` with `extra` headers; `Ok` on its delivery
    /// report.
    async fn copy(&self, topic: &str, extra: &[(&str, String)]) -> Result<(), BrokerError> {
        let d = &self.delivery;
        let mut headers = OwnedHeaders::new();
        let skip = |name: &str| extra.iter().any(|(n, _)| *n == name) || name == MESSAGE_ID_HEADER;
        for (name, value) in d.headers.iter().filter(|(n, _)| !skip(n)) {
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_str()),
            });
        }
        if let Some(id) = &d.message_id {
            headers = headers.insert(Header {
                key: MESSAGE_ID_HEADER,
                value: Some(id.as_str()),
            });
        }
        for (name, value) in extra {
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_str()),
            });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic)
            .payload(&d.payload[..])
            .headers(headers);
        if let Some(key) = &self.key {
            record = record.key(&key[..]);
        }
        if let Some(ms) = d
            .published_at
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|t| i64::try_from(t.as_millis()).ok())
        {
            record = record.timestamp(ms);
        }
        self.copies
            .producer
            .send(record, COPY_TIMEOUT)
            .await
            .map(drop)
            .map_err(|(e, _)| classify(format!("copying {} to {topic}", self.origin), e))
    }

    /// Where the record was first written: its own place, or the origin a retried copy
    /// carries.
    fn first_origin(&self) -> String {
        self.delivery
            .header(ORIGIN_HEADER)
            .unwrap_or(&self.origin)
            .to_owned()
    }

    /// Count the record settled; commit the partition's settled prefix if it grew.
    fn done(&self) -> Result<(), BrokerError> {
        let Some(generation) = self.generation else {
            return Ok(());
        };
        let Some(next) = self
            .offsets
            .settled(&self.partition, self.offset, generation)
        else {
            return Ok(());
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.partition.0, self.partition.1, Offset::Offset(next))
            .map_err(|e| classify("building the offsets to commit", e))?;
        self.consumer.commit(&tpl, CommitMode::Async).map_err(|e| {
            classify(
                format!(
                    "committing {}/{} at {next}",
                    self.partition.0, self.partition.1
                ),
                e,
            )
        })
    }
}

#[async_trait]
impl Pending for KafkaPending {
    fn delivery(&self) -> &Delivery {
        &self.delivery
    }

    async fn settle(self, action: Action, shutdown: &Shutdown) -> Result<(), BrokerError> {
        match action {
            Action::Ack => {}
            Action::Retry { delay } => {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.wait() => {}
                }
                let retries = self
                    .delivery
                    .header(RETRIES_HEADER)
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0)
                    + 1;
                let topic = self.copies.retry_topic.clone();
                let origin = self.first_origin();
                self.copy(
                    &topic,
                    &[
                        (RETRIES_HEADER, retries.to_string()),
                        (ORIGIN_HEADER, origin),
                    ],
                )
                .await?;
            }
            Action::DeadLetter { reason, headers } => {
                let topic = self.copies.dead_letter_topic.clone();
                let origin = self.first_origin();
                let mut extra = vec![(DEAD_LETTER_REASON, reason), (ORIGIN_HEADER, origin)];
                extra.extend(headers.iter().map(|(n, v)| (n.as_str(), v.clone())));
                self.copy(&topic, &extra).await?;
            }
        }
        self.done()
    }
}
