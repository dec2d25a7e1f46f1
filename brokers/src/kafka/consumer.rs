//! [`KafkaConsumer`]: a topic's records, read as a consumer group, through a
//! [`Handle`](crate::Handle), committing only offsets whose records (and every earlier one
//! of the partition) settled.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use futures::FutureExt;
use rdkafka::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::producer::{FutureProducer, Producer};

use super::errors::classify;
use super::offsets::{Offsets, Rebalancing};
use super::pending::{Copies, KafkaPending};
use super::publisher::producer_config;
use super::{MESSAGE_ID_HEADER, RETRIES_HEADER};
use crate::consumer::consumer_plumbing;
use crate::{BrokerError, ConsumerConfig, Delivery, Health, Shutdown, Source};

/// Consumes a Kafka topic as a member of a consumer group, with
/// `enable.auto.commit=false`.
///
/// - Key: each record's [`MESSAGE_ID_HEADER`] header. A record without it is dead-lettered
///   (`no message id`), unless [`fall_back_to_offset`](Self::fall_back_to_offset) makes
///   `topic/partition/offset` its id.
/// - Commits: a partition's offset is committed only past records that settled, and only
///   once every earlier record of that partition settled too (the settled prefix).
/// - Retry: the record is copied (payload, key, headers, id, original timestamp, plus
///   [`RETRIES_HEADER`]) to the retry topic (the consumed topic unless
///   [`retry_topic`](Self::retry_topic) sets one; the consumer reads both) after the delay,
///   and counts as settled once the broker's delivery report came.
/// - Dead letter: the record is copied with the reason in
///   [`DEAD_LETTER_REASON`](crate::DEAD_LETTER_REASON) to the dead-letter topic, then
///   counts as settled once its delivery report came.
/// - Rebalance: before partitions are revoked, the settled prefix of each is committed.
///   Records of it still in flight then settle without a commit. The partition's new
///   owner gets them again, and its inbox answers the copies.
///
/// # Examples
///
/// ```no_run
/// use dedup_brokers::kafka::KafkaConsumer;
/// use dedup_brokers::{ConsumerConfig, shutdown, with_inbox};
/// use dedup_core::{BoxError, Inbox, MemoryStore};
///
/// # async fn example() -> Result<(), BoxError> {
/// let inbox = Inbox::new(MemoryStore::new()); // your store
/// let handler = with_inbox(inbox, |_lease, delivery| async move {
///     println!("{} bytes", delivery.payload.len());
///     Ok::<_, BoxError>(None)
/// });
///
/// let consumer = KafkaConsumer::new("127.0.0.1:9092", "billing", "orders", "orders.dead", ConsumerConfig::default())
///     .set("session.timeout.ms", "10000");
/// let (stop, signal) = shutdown();
/// let running = tokio::spawn(consumer.run(handler, signal));
/// // ... later, on SIGTERM:
/// stop.shut_down();
/// running.await??;
/// # Ok(())
/// # }
/// ```
pub struct KafkaConsumer {
    settings: ClientConfig,
    group: String,
    topic: String,
    retry_topic: Option<String>,
    dead_letter_topic: String,
    offset_fallback: bool,
    config: ConsumerConfig,
    health: Health,
    offsets: Offsets,
    consumer: Option<Arc<StreamConsumer<Rebalancing>>>,
    copies: Option<Arc<Copies>>,
}

consumer_plumbing!(
    KafkaConsumer,
    debug: [group, topic, retry_topic, dead_letter_topic, offset_fallback],
    on_shutdown: "lets started handlers finish and settle, and commits every \
         partition's settled prefix.",
    errors: [
        "[`BrokerError::Config`]: an invalid [`ConsumerConfig`], or a dead-letter topic \
         that is empty or one of the consumed topics. Nothing was consumed.",
        "[`BrokerError::Refused`]: refused credentials or access, or a retry or \
         dead-letter topic that does not exist (a copy sent there would be lost).",
    ],
    redelivery: ": offsets past the settled prefix are not committed.",
);

impl KafkaConsumer {
    /// A consumer of `topic` in consumer group `group`, on the cluster at `brokers`.
    ///
    /// `brokers` is `bootstrap.servers`. Dead letters go to `dead_letter_topic`, which
    /// must exist. It starts at the earliest offset when the group has committed none.
    /// Nothing is contacted until [`run`](Self::run).
    pub fn new(
        brokers: impl Into<String>,
        group: impl Into<String>,
        topic: impl Into<String>,
        dead_letter_topic: impl Into<String>,
        config: ConsumerConfig,
    ) -> Self {
        let mut settings = ClientConfig::new();
        settings
            .set("bootstrap.servers", brokers.into())
            .set("auto.offset.reset", "earliest");
        KafkaConsumer {
            settings,
            group: group.into(),
            topic: topic.into(),
            retry_topic: None,
            dead_letter_topic: dead_letter_topic.into(),
            offset_fallback: false,
            config,
            health: Health::default(),
            offsets: Offsets::default(),
            consumer: None,
            copies: None,
        }
    }

    /// Set a librdkafka property of the consumer and of its producer of copies (security,
    /// timeouts). `group.id`, `enable.auto.commit`, `enable.idempotence` and `acks` are the
    /// consumer's own and set after these.
    pub fn set(mut self, key: &str, value: impl Into<String>) -> Self {
        self.settings.set(key, value);
        self
    }

    /// Where retried records are copied (default: the consumed topic). The consumer reads
    /// it too.
    pub fn retry_topic(mut self, topic: impl Into<String>) -> Self {
        self.retry_topic = Some(topic.into());
        self
    }

    /// Whether a record without the [`MESSAGE_ID_HEADER`] header gets `topic/partition/offset`
    /// as its id instead of being dead-lettered (default: no). That id is the record's
    /// place in the log: a redelivery of the record is deduplicated, but a producer that
    /// sent the same message twice (a retry after a lost acknowledgement without the
    /// idempotent producer, or a second send by the application) wrote two records with two
    /// ids, and both are handled.
    pub fn fall_back_to_offset(mut self, on: bool) -> Self {
        self.offset_fallback = on;
        self
    }

    fn topics(&self) -> Vec<&str> {
        let mut topics = vec![self.topic.as_str()];
        if let Some(retry) = self.retry_topic.as_deref().filter(|t| *t != self.topic) {
            topics.push(retry);
        }
        topics
    }

    fn pending(
        &self,
        record: &BorrowedMessage<'_>,
        consumer: &Arc<StreamConsumer<Rebalancing>>,
        copies: &Arc<Copies>,
    ) -> KafkaPending {
        let partition = (record.topic().to_owned(), record.partition());
        let offset = record.offset();
        let generation = self.offsets.fetched(&partition, offset);
        let origin = format!("{}/{}/{}", partition.0, partition.1, offset);
        let delivery = delivery(record, &origin, self.offset_fallback);
        KafkaPending::new(
            delivery,
            record.key().map(<[u8]>::to_vec),
            origin,
            partition,
            offset,
            generation,
            self.offsets.clone(),
            Arc::clone(consumer),
            Arc::clone(copies),
        )
    }

    /// Commit every partition's settled prefix now and wait for the broker.
    fn commit_now(&self) {
        let positions = self.offsets.positions();
        if let (Some(consumer), true) = (&self.consumer, positions.count() > 0)
            && let Err(e) = consumer.commit(&positions, CommitMode::Sync)
        {
            tracing::warn!(group = %self.group, error = %dedup_core::error_chain(&e), "could not commit the settled offsets at shutdown; their records come again");
        }
    }
}

#[async_trait]
impl Source for KafkaConsumer {
    type Pending = KafkaPending;

    fn endpoint(&self) -> &str {
        &self.group
    }

    fn check(&self, _config: &ConsumerConfig) -> Result<(), BrokerError> {
        if self.dead_letter_topic.is_empty()
            || self.topics().contains(&self.dead_letter_topic.as_str())
        {
            return Err(BrokerError::Config(
                "the dead-letter topic must be named and differ from the consumed topics".into(),
            ));
        }
        Ok(())
    }

    async fn connect(&mut self, _config: &ConsumerConfig) -> Result<(), BrokerError> {
        if let Some(old) = self.consumer.take() {
            old.unsubscribe();
        }
        self.offsets.clear();
        let mut settings = self.settings.clone();
        settings
            .set("group.id", &self.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        let context = Rebalancing::new(self.offsets.clone(), self.group.clone());
        // Not creating topics on a lookup: a missing copies' topic must be refused, not
        // made (with the broker's default partitions) by the check itself.
        let producer: FutureProducer = producer_config(&self.settings)
            .set("allow.auto.create.topics", "false")
            .create()
            .map_err(|e| classify("creating the Kafka producer of retries and dead letters", e))?;
        let retry_topic = self
            .retry_topic
            .clone()
            .unwrap_or_else(|| self.topic.clone());
        for topic in [&retry_topic, &self.dead_letter_topic] {
            check_topic(&producer, topic).await?;
        }
        let consumer: StreamConsumer<Rebalancing> = settings
            .create_with_context(context)
            .map_err(|e| classify("creating the Kafka consumer", e))?;
        consumer
            .subscribe(&self.topics())
            .map_err(|e| classify(format!("subscribing to {:?}", self.topics()), e))?;
        self.copies = Some(Arc::new(Copies {
            producer,
            retry_topic,
            dead_letter_topic: self.dead_letter_topic.clone(),
        }));
        self.consumer = Some(Arc::new(consumer));
        Ok(())
    }

    async fn fetch(
        &mut self,
        max: usize,
        shutdown: &Shutdown,
    ) -> Result<Vec<KafkaPending>, BrokerError> {
        let (Some(consumer), Some(copies)) = (self.consumer.clone(), self.copies.clone()) else {
            return Err(BrokerError::broker("consuming", "not subscribed"));
        };
        let first = tokio::select! {
            biased;
            _ = shutdown.wait() => return Ok(Vec::new()),
            _ = tokio::time::sleep(Duration::from_millis(500)) => return Ok(Vec::new()),
            next = consumer.recv() => next,
        };
        let first = match first {
            Ok(record) => record,
            Err(e) => {
                return match classify(format!("consuming {:?}", self.topics()), e) {
                    // librdkafka reconnects to the brokers by itself (a new consumer would
                    // only cost a rebalance): report it and go on.
                    BrokerError::Broker { context, source } => {
                        tracing::warn!(group = %self.group, %context, error = %dedup_core::error_chain(&*source), "Kafka consumer error; librdkafka retries");
                        Ok(Vec::new())
                    }
                    refused => Err(refused),
                };
            }
        };
        let mut fetched = vec![self.pending(&first, &consumer, &copies)];
        drop(first);
        // Whatever else librdkafka already holds, up to `max`, without waiting.
        while fetched.len() < max {
            match consumer.recv().now_or_never() {
                Some(Ok(record)) => fetched.push(self.pending(&record, &consumer, &copies)),
                Some(Err(e)) => {
                    tracing::warn!(group = %self.group, error = %dedup_core::error_chain(&e), "consuming");
                    break;
                }
                None => break,
            }
        }
        Ok(fetched)
    }

    async fn give_back(&mut self) {
        // What was fetched and not started is not committed: the group delivers it again.
        self.commit_now();
    }
}

/// Refuse to run when `topic`, where copies go, does not exist: a dead letter or a retry
/// would be lost (the record counts as settled only once its copy is confirmed, so it would
/// block its partition's commits instead).
async fn check_topic(producer: &FutureProducer, topic: &str) -> Result<(), BrokerError> {
    let (producer, name) = (producer.clone(), topic.to_owned());
    let metadata = tokio::task::spawn_blocking(move || {
        producer
            .client()
            .fetch_metadata(Some(&name), Duration::from_secs(10))
    })
    .await
    .map_err(|e| BrokerError::broker(format!("looking up topic {topic}"), e))?
    .map_err(|e| classify(format!("looking up topic {topic}"), e))?;
    match metadata.topics().iter().find(|t| t.name() == topic) {
        Some(t) if t.error().is_none() && !t.partitions().is_empty() => Ok(()),
        Some(t) => Err(BrokerError::refused(
            format!("checking the copies' topic {topic}"),
            format!(
                "the topic is missing or unusable ({:?}); create it first",
                t.error().map(RDKafkaErrorCode::from)
            ),
        )),
        None => Err(BrokerError::refused(
            format!("checking the copies' topic {topic}"),
            "the broker does not list the topic; create it first",
        )),
    }
}

fn delivery(record: &BorrowedMessage<'_>, origin: &str, offset_fallback: bool) -> Delivery {
    let mut headers = Vec::new();
    if let Some(h) = record.headers() {
        for header in h.iter() {
            if let Some(value) = header.value.and_then(|v| std::str::from_utf8(v).ok()) {
                headers.push((header.key.to_owned(), value.to_owned()));
            }
        }
    }
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let message_id = find(MESSAGE_ID_HEADER).or_else(|| offset_fallback.then(|| origin.to_owned()));
    let redelivered = find(RETRIES_HEADER).is_some();
    Delivery {
        message_id,
        payload: record
            .payload()
            .map(bytes::Bytes::copy_from_slice)
            .unwrap_or_default(),
        published_at: record
            .timestamp()
            .to_millis()
            .and_then(|ms| u64::try_from(ms).ok())
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
        headers,
        redelivered,
        broker_ref: origin.to_owned(),
    }
}
