//! [`KafkaPublisher`]: outbox rows to Kafka with the idempotent producer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use dedup_core::BoxError;
use dedup_core::outbox::{OutboxRow, Publisher};
use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;

use super::MESSAGE_ID_HEADER;

/// How long a call may wait for room in the producer's local queue (at most the message
/// timeout); the rows it could not queue by then count as failed.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(5);

/// librdkafka's `message.timeout.ms` when the settings do not set it (librdkafka's own
/// default, 300 s, would outlast any relay's hold).
pub const DEFAULT_MESSAGE_TIMEOUT: Duration = Duration::from_secs(15);

/// The settings that name the message timeout (`delivery.timeout.ms` is librdkafka's alias).
const MESSAGE_TIMEOUT_KEYS: [&str; 2] = ["message.timeout.ms", "delivery.timeout.ms"];

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

/// The message timeout `config` sets, if it sets one: the longer when it sets both names
/// (librdkafka checked they are numbers of milliseconds when the producer was made).
fn message_timeout(config: &ClientConfig) -> Option<Duration> {
    MESSAGE_TIMEOUT_KEYS
        .iter()
        .filter_map(|key| config.get(key))
        .map(|ms| {
            ms.trim()
                .parse()
                .map_or(Duration::MAX, Duration::from_millis)
        })
        .max()
}

/// Publishes outbox rows to Kafka topics (the row's destination) with the idempotent
/// producer and `acks=all`: `Ok` only once the delivery report says the broker stored the
/// record on all in-sync replicas. The row's `message_id` becomes the [`MESSAGE_ID_HEADER`]
/// header, its headers Kafka headers, its `ordering_key` the record key (so rows of one key
/// land in one partition, in order); rows without one get no key.
///
/// # Time
///
/// librdkafka keeps a queued message, and retries it across an outage, until its
/// `message.timeout.ms` runs out: [`DEFAULT_MESSAGE_TIMEOUT`] (15 s) unless the settings
/// given to [`from_config`](Self::from_config) set it (or its alias `delivery.timeout.ms`).
/// A call waits at most 5 s (at most the message timeout) for room in the local queue, so
/// its [`delivery_timeout`](Publisher::delivery_timeout) is that wait plus the message
/// timeout: 20 s by default, which fits a relay's default 30 s hold. A relay refuses a
/// publisher whose timeout does not fit its hold: with librdkafka's own default of 300 s,
/// a publish still queued when the hold ran out would land after another relay published
/// the row again.
///
/// A message that timed out makes librdkafka bump the idempotent producer's epoch by itself.
/// A broker that refuses the bumped epoch (Tansu 0.6.0 answers `PRODUCER_FENCED`), or
/// any fatal error of the producer, would stop it for good: the publisher then makes a new
/// producer (a new producer id) for its next call, and says so in a warning.
///
/// # Errors
///
/// A publish answers `Err` whenever the delivery report did not confirm the record: it
/// may or may not be stored. The relay then publishes it again later, with the same
/// message id, and the consumer's inbox drops the copy.
///
/// # Cancel safety
///
/// A dropped publish may still land: librdkafka keeps the queued record until its
/// message timeout. The relay counts its rows as not published, and publishes them again.
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
/// use dedup_brokers::kafka::KafkaPublisher;
/// use dedup_core::outbox::{OutboxStore, Relay};
///
/// # async fn example(outbox: Arc<dyn OutboxStore>) -> Result<(), dedup_core::BoxError> {
/// let publisher = KafkaPublisher::new("127.0.0.1:9092")?;
/// let relay = Relay::new(outbox, Arc::new(publisher)).start()?;
/// // ... on shutdown:
/// relay.stop().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct KafkaPublisher {
    producer: Arc<Mutex<FutureProducer>>,
    /// A delivery report said the broker fenced the producer.
    fenced: Arc<AtomicBool>,
    config: ClientConfig,
    message_timeout: Duration,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher").finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// A publisher to the cluster at `brokers` (`bootstrap.servers`).
    ///
    /// # Errors
    ///
    /// rdkafka's error when librdkafka refuses to create the producer.
    pub fn new(brokers: &str) -> Result<Self, KafkaError> {
        let mut settings = ClientConfig::new();
        settings.set("bootstrap.servers", brokers);
        Self::from_config(&settings)
    }

    /// A publisher from librdkafka settings (security, `message.timeout.ms`...);
    /// `enable.idempotence` and `acks` are set over them, and `message.timeout.ms` to
    /// [`DEFAULT_MESSAGE_TIMEOUT`] when they do not set it.
    ///
    /// # Errors
    ///
    /// rdkafka's error when librdkafka refuses the settings or the producer.
    pub fn from_config(settings: &ClientConfig) -> Result<Self, KafkaError> {
        let mut config = producer_config(settings);
        if message_timeout(&config).is_none() {
            config.set(
                MESSAGE_TIMEOUT_KEYS[0],
                DEFAULT_MESSAGE_TIMEOUT.as_millis().to_string(),
            );
        }
        let producer = config.create()?;
        Ok(KafkaPublisher {
            producer: Arc::new(Mutex::new(producer)),
            fenced: Arc::default(),
            message_timeout: message_timeout(&config).unwrap_or(DEFAULT_MESSAGE_TIMEOUT),
            config,
        })
    }

    /// The producer to queue on: the current one, or a new one when the current one met a
    /// fatal error or was fenced (see the type's docs).
    fn producer(&self) -> Result<FutureProducer, KafkaError> {
        let mut current = self.producer.lock().unwrap_or_else(|e| e.into_inner());
        let fatal = current.client().fatal_error();
        if fatal.is_some() || self.fenced.load(Ordering::Acquire) {
            let (code, text) = fatal.unwrap_or((RDKafkaErrorCode::ProducerFenced, String::new()));
            tracing::warn!(%code, error = %text, "Kafka publisher: the broker fenced the producer or it met a fatal error; making a new one");
            *current = self.config.create()?;
            self.fenced.store(false, Ordering::Release);
        }
        Ok(current.clone())
    }

    /// The `message.timeout.ms` the producer runs with.
    pub fn message_timeout(&self) -> Duration {
        self.message_timeout
    }

    /// How long a call waits for room in the local queue.
    fn queue_timeout(&self) -> Duration {
        QUEUE_TIMEOUT.min(self.message_timeout)
    }

    /// Queue one row, waiting for room in the local queue until `deadline`; its delivery
    /// report is awaited separately.
    fn send(
        &self,
        row: &OutboxRow,
        deadline: std::time::Instant,
    ) -> Result<DeliveryFuture, KafkaError> {
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
        let producer = self.producer()?;
        loop {
            match producer.send_result(record) {
                Ok(delivery) => return Ok(delivery),
                Err((KafkaError::MessageProduction(code), back))
                    if code == rdkafka::types::RDKafkaErrorCode::QueueFull
                        && std::time::Instant::now() < deadline =>
                {
                    // The local queue is full: let librdkafka send some, then queue again.
                    producer.poll(Duration::from_millis(10));
                    record = back;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }
}

impl KafkaPublisher {
    /// The delivery report as a result; a fenced producer is noted (see
    /// [`producer`](Self::producer)).
    async fn delivered(&self, destination: &str, delivery: DeliveryFuture) -> Result<(), BoxError> {
        match delivery.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((e, _))) => {
                if matches!(
                    e.rdkafka_error_code(),
                    Some(RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch)
                ) {
                    self.fenced.store(true, Ordering::Release);
                }
                Err(Box::new(Undelivered {
                    destination: destination.to_owned(),
                    source: e,
                }))
            }
            Err(_) => Err(format!("the producer was closed before {destination} confirmed").into()),
        }
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

    /// The wait for room in the local queue (5 s at most) plus `message.timeout.ms`.
    fn delivery_timeout(&self) -> Duration {
        self.queue_timeout().saturating_add(self.message_timeout)
    }

    async fn publish(&self, row: &OutboxRow) -> Result<(), BoxError> {
        let delivery = self.send(row, std::time::Instant::now() + self.queue_timeout())?;
        self.delivered(&row.destination, delivery).await
    }

    /// Queues every row (in order: with the idempotent producer, one partition keeps it),
    /// then awaits the delivery reports. The rows share one wait for room in the queue.
    async fn publish_all(&self, rows: &[OutboxRow]) -> Vec<Result<(), BoxError>> {
        let deadline = std::time::Instant::now() + self.queue_timeout();
        let queued: Vec<_> = rows.iter().map(|row| self.send(row, deadline)).collect();
        let mut results = Vec::with_capacity(rows.len());
        for (row, delivery) in rows.iter().zip(queued) {
            results.push(match delivery {
                Ok(delivery) => self.delivered(&row.destination, delivery).await,
                Err(e) => Err(e.into()),
            });
        }
        results
    }
}
