//! [`KafkaPublisher`]: outbox rows to Kafka with the idempotent producer.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use dedup_core::BoxError;
use dedup_core::outbox::{OutboxRow, Publisher};
use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};

use super::MESSAGE_ID_HEADER;

/// How long a row may wait in the producer's queue before it counts as failed (librdkafka's
/// `message.timeout.ms` bounds the whole delivery too).
const QUEUE_TIMEOUT: Duration = Duration::from_secs(5);

/// `settings` with the producer settings this crate relies on: the idempotent producer
/// (`enable.idempotence=true`, hence `acks=all`), so the producer's own retries never
/// write a record twice or out of order.
pub(crate) fn producer_config(settings: &ClientConfig) -> ClientConfig {
    let mut config = settings.clone();
    for consumer_only in ["auto.offset.reset", "group.id", "enable.auto.commit"] {
        config.remove(consumer_only);
    }
    config.set("enable.idempotence", "true").set("acks", "all");
    config
}

/// Publishes outbox rows to Kafka topics (the row's destination) with the idempotent
/// producer and `acks=all`: `Ok` only once the delivery report says the broker stored the
/// record on all in-sync replicas. The row's `message_id` becomes the [`MESSAGE_ID_HEADER`]
/// header, its headers Kafka headers, its `ordering_key` the record key (so rows of one key
/// land in one partition, in order); rows without one get no key.
#[derive(Clone)]
pub struct KafkaPublisher {
    producer: FutureProducer,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher").finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// A publisher to the cluster at `brokers` (`bootstrap.servers`).
    pub fn new(brokers: &str) -> Result<Self, KafkaError> {
        let mut settings = ClientConfig::new();
        settings.set("bootstrap.servers", brokers);
        Self::from_config(&settings)
    }

    /// A publisher from librdkafka settings (security, `message.timeout.ms`...);
    /// `enable.idempotence` and `acks` are set over them.
    pub fn from_config(settings: &ClientConfig) -> Result<Self, KafkaError> {
        Ok(KafkaPublisher {
            producer: producer_config(settings).create()?,
        })
    }

    /// Queue one row; its delivery report is awaited separately.
    fn send(&self, row: &OutboxRow) -> Result<DeliveryFuture, KafkaError> {
        let mut headers = OwnedHeaders::new().insert(Header {
            key: MESSAGE_ID_HEADER,
            value: Some(row.message_id.as_str()),
        });
        for (name, value) in row.headers.iter().filter(|(n, _)| n != MESSAGE_ID_HEADER) {
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_str()),
            });
        }
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        let mut record: FutureRecord<'_, str, [u8]> = FutureRecord::to(&row.destination)
            .payload(&row.payload[..])
            .headers(headers)
            .timestamp(i64::try_from(now).unwrap_or(i64::MAX));
        if let Some(key) = &row.ordering_key {
            record = record.key(key.as_str());
        }
        let deadline = std::time::Instant::now() + QUEUE_TIMEOUT;
        loop {
            match self.producer.send_result(record) {
                Ok(delivery) => return Ok(delivery),
                Err((KafkaError::MessageProduction(code), back))
                    if code == rdkafka::types::RDKafkaErrorCode::QueueFull
                        && std::time::Instant::now() < deadline =>
                {
                    // The local queue is full: let librdkafka send some, then queue again.
                    self.producer.poll(Duration::from_millis(10));
                    record = back;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }
}

/// The delivery report as a result.
async fn delivered(destination: &str, delivery: DeliveryFuture) -> Result<(), BoxError> {
    match delivery.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((e, _))) => Err(Box::new(Undelivered {
            destination: destination.to_owned(),
            source: e,
        })),
        Err(_) => Err(format!("the producer was closed before {destination} confirmed").into()),
    }
}

/// A record the broker did not confirm.
#[derive(Debug, thiserror::Error)]
#[error("Kafka did not confirm the record to {destination}")]
struct Undelivered {
    destination: String,
    #[source]
    source: KafkaError,
}

#[async_trait]
impl Publisher for KafkaPublisher {
    fn name(&self) -> &'static str {
        "kafka"
    }

    async fn publish(&self, row: &OutboxRow) -> Result<(), BoxError> {
        let delivery = self.send(row)?;
        delivered(&row.destination, delivery).await
    }

    /// Queues every row (in order: with the idempotent producer, one partition keeps it),
    /// then awaits the delivery reports.
    async fn publish_all(&self, rows: &[OutboxRow]) -> Vec<Result<(), BoxError>> {
        let queued: Vec<_> = rows.iter().map(|row| self.send(row)).collect();
        let mut results = Vec::with_capacity(rows.len());
        for (row, delivery) in rows.iter().zip(queued) {
            results.push(match delivery {
                Ok(delivery) => delivered(&row.destination, delivery).await,
                Err(e) => Err(e.into()),
            });
        }
        results
    }
}
