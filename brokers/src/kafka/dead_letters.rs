//! [`KafkaDeadLetters`]: the records of a dead-letter topic, read back for a replay. Kafka
//! cannot delete one record, so a settled copy is marked by a later record instead.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::errors::classify;
use super::publisher::producer_config;
use super::{MESSAGE_ID_HEADER, ORIGIN_HEADER, RETRIES_HEADER, SETTLED_HEADER};
use crate::BrokerError;
use crate::replay::{DeadLetter, DeadLetters};

/// How long a read waits for a record before it counts the topic's end reached.
const IDLE: Duration = Duration::from_millis(500);
/// How long a read of the whole topic may take.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a republished record or a marker may wait for its delivery report.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// The dead letters of one dead-letter topic, which a
/// [`KafkaConsumer`](super::KafkaConsumer) writes.
///
/// - Take: the session reads the topic twice, up to the end it found first. The first
///   read collects the settle markers, the second hands out the copies no marker names, in
///   offset order per partition.
/// - Republish: to the partition and topic of the copy's [`ORIGIN_HEADER`] (the record's
///   first place), with its key, message id, payload and headers. The failure headers and
///   the consumer's own ([`ORIGIN_HEADER`], [`RETRIES_HEADER`]) are dropped. It is sent
///   with the idempotent producer and waits for the delivery report. A replay handles the
///   copies one at a time, so each key's records land on its partition in their order.
/// - Settle: a marker record on the copy's partition: no key, an empty payload, and the
///   [`SETTLED_HEADER`] naming the copy's `partition/offset`. Later sessions skip both.
/// - Give back: nothing to do, a topic holds no delivery.
///
/// The limits of marking: every session reads the whole topic, twice. The topic grows by
/// one small record per settled copy, until its retention removes both (a copy always
/// before its marker). A compacted topic is not supported: it refuses records without a
/// key. Other readers of the topic see the markers too.
pub struct KafkaDeadLetters {
    settings: ClientConfig,
    topic: String,
    producer: FutureProducer,
    reader: Option<Box<Reader>>,
}

impl std::fmt::Debug for KafkaDeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaDeadLetters")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl KafkaDeadLetters {
    /// The dead letters in `topic`, on the cluster librdkafka `settings` name.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Refused`] when librdkafka refuses the settings.
    pub fn new(settings: &ClientConfig, topic: impl Into<String>) -> Result<Self, BrokerError> {
        let producer = producer_config(settings)
            .set("allow.auto.create.topics", "false")
            .create()
            .map_err(|e| classify("creating the Kafka producer of replays", e))?;
        Ok(KafkaDeadLetters {
            settings: settings.clone(),
            topic: topic.into(),
            producer,
            reader: None,
        })
    }

    /// Opens `url`: `kafka://HOST:PORT[,HOST:PORT...]?topic=DEAD_LETTER_TOPIC`. Its other
    /// parameters are librdkafka settings (`security.protocol=ssl`, ...).
    ///
    /// # Errors
    ///
    /// [`BrokerError::Config`] for a URL without the topic or the brokers;
    /// [`BrokerError::Refused`] when librdkafka refuses a setting.
    pub fn open(url: &str) -> Result<Self, BrokerError> {
        let (url, topic) = crate::replay::url_param(url, "topic")?;
        let rest = url.strip_prefix("kafka://").unwrap_or(&url);
        let (brokers, query) = rest.split_once('?').unwrap_or((rest, ""));
        let brokers = brokers.trim_end_matches('/');
        if brokers.is_empty() {
            return Err(BrokerError::Config(
                "the dead letters' URL names no broker: kafka://HOST:PORT?topic=NAME".into(),
            ));
        }
        let mut settings = ClientConfig::new();
        settings.set("bootstrap.servers", brokers);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            settings.set(key, value);
        }
        Self::new(&settings, topic)
    }

    /// The reader, made (and the topic read once for its markers) on the first call.
    async fn reader(&mut self) -> Result<Box<Reader>, BrokerError> {
        if let Some(reader) = self.reader.take() {
            return Ok(reader);
        }
        let (settings, topic) = (self.settings.clone(), self.topic.clone());
        let producer = self.producer.clone();
        blocking(move || {
            let partitions = partitions(&producer, &topic)?;
            Reader::start(&settings, &topic, &partitions)
        })
        .await
    }

    /// Sends `record`; `Ok` on its delivery report.
    async fn send(
        &self,
        record: FutureRecord<'_, [u8], [u8]>,
        context: String,
    ) -> Result<(), BrokerError> {
        self.producer
            .send(record, SEND_TIMEOUT)
            .await
            .map(drop)
            .map_err(|(e, _)| classify(context, e))
    }

    /// The partition and offset of a copy's `place`.
    fn place(&self, letter: &DeadLetter) -> Result<(i32, i64), BrokerError> {
        parse_place(&letter.place).ok_or_else(|| {
            BrokerError::Config(format!(
                "{:?} is no place in {}: partition/offset expected",
                letter.place, self.topic
            ))
        })
    }
}

#[async_trait]
impl DeadLetters for KafkaDeadLetters {
    fn describe(&self) -> String {
        format!("Kafka topic {:?}", self.topic)
    }

    async fn take(&mut self, limit: usize) -> Result<Vec<DeadLetter>, BrokerError> {
        let reader = self.reader().await?;
        let (reader, taken) = blocking(move || {
            let mut reader = reader;
            let taken = reader.next(limit)?;
            Ok((reader, taken))
        })
        .await?;
        self.reader = Some(reader);
        Ok(taken)
    }

    async fn republish(&mut self, letter: &DeadLetter) -> Result<(), BrokerError> {
        let origin = letter.header(ORIGIN_HEADER).and_then(parse_origin);
        let Some((topic, partition)) = origin else {
            return Err(BrokerError::refused(
                format!("republishing {}", letter.place),
                format!("the copy has no valid {ORIGIN_HEADER} header (topic/partition/offset)"),
            ));
        };
        let id = letter.message_id.as_deref().ok_or_else(|| {
            BrokerError::Config(format!("the copy at {} has no message id", letter.place))
        })?;
        let mut headers = OwnedHeaders::new().insert(Header {
            key: MESSAGE_ID_HEADER,
            value: Some(id),
        });
        let own = |n: &str| [MESSAGE_ID_HEADER, ORIGIN_HEADER, RETRIES_HEADER].contains(&n);
        let kept = letter.replay_headers();
        for (name, value) in kept.iter().filter(|(n, _)| !own(n)) {
            headers = headers.insert(Header {
                key: name,
                value: Some(value),
            });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic)
            .partition(partition)
            .payload(&letter.payload[..])
            .headers(headers);
        if let Some(key) = &letter.key {
            record = record.key(&key[..]);
        }
        let context = format!("republishing {} to {topic}/{partition}", letter.place);
        self.send(record, context).await
    }

    async fn settle(&mut self, letter: &DeadLetter) -> Result<(), BrokerError> {
        let (partition, offset) = self.place(letter)?;
        let place = format!("{partition}/{offset}");
        let headers = OwnedHeaders::new().insert(Header {
            key: SETTLED_HEADER,
            value: Some(place.as_str()),
        });
        let marker: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&self.topic)
            .partition(partition)
            .payload(&[][..])
            .headers(headers);
        let context = format!("marking {place} settled in {}", self.topic);
        self.send(marker, context).await
    }

    async fn give_back(&mut self) -> Result<(), BrokerError> {
        Ok(())
    }
}

/// `f` on tokio's blocking threads (librdkafka's consumer polls block).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BrokerError> + Send + 'static,
) -> Result<T, BrokerError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| BrokerError::broker("reading the dead letters", e))?
}

/// `partition/offset`.
fn parse_place(place: &str) -> Option<(i32, i64)> {
    let (partition, offset) = place.split_once('/')?;
    Some((partition.parse().ok()?, offset.parse().ok()?))
}

/// The topic and partition of an [`ORIGIN_HEADER`] value, `topic/partition/offset` (topic
/// names hold no `/`).
fn parse_origin(origin: &str) -> Option<(&str, i32)> {
    let mut parts = origin.rsplitn(3, '/');
    let (_offset, partition, topic) = (parts.next()?, parts.next()?, parts.next()?);
    Some((topic, partition.parse().ok()?)).filter(|(t, _)| !t.is_empty())
}

/// The second read of a session: its consumer, the markers the first read found, and where
/// each partition's end is.
struct Reader {
    consumer: BaseConsumer,
    topic: String,
    /// `(partition, offset)` of every copy a marker names.
    marked: HashSet<(i32, i64)>,
    /// The last offset of each partition the session reads (partitions read to the end
    /// are removed).
    ends: BTreeMap<i32, i64>,
}

impl Reader {
    /// Reads `topic` to its end for the markers, then starts the second read. The end: each
    /// partition read up to its high watermark at least, then no record for [`IDLE`] (some
    /// brokers, Tansu among them, report a watermark below the log's end).
    fn start(
        settings: &ClientConfig,
        topic: &str,
        partitions: &[(i32, i64)],
    ) -> Result<Box<Reader>, BrokerError> {
        let ids: Vec<i32> = partitions.iter().map(|(id, _)| *id).collect();
        let mut marked = HashSet::new();
        let mut ends = BTreeMap::new();
        let mut below: BTreeMap<i32, i64> = partitions.iter().copied().collect();
        if !below.is_empty() {
            let first = consumer(settings, topic, &ids)?;
            let started = Instant::now();
            let mut last = Instant::now();
            while !below.is_empty() || last.elapsed() < IDLE {
                if started.elapsed() > READ_TIMEOUT {
                    return Err(BrokerError::broker(
                        format!("reading {topic}"),
                        format!("the topic was not read to its end within {READ_TIMEOUT:?}"),
                    ));
                }
                let Some(record) = first.poll(Duration::from_millis(100)) else {
                    continue;
                };
                let record = record.map_err(|e| classify(format!("reading {topic}"), e))?;
                last = Instant::now();
                let (partition, offset) = (record.partition(), record.offset());
                if below
                    .get(&partition)
                    .is_some_and(|&high| offset + 1 >= high)
                {
                    below.remove(&partition);
                }
                ends.insert(partition, offset);
                if let Some(place) = header(&record, SETTLED_HEADER).and_then(parse_place) {
                    marked.insert(place);
                }
            }
        }
        Ok(Box::new(Reader {
            consumer: consumer(settings, topic, &ids)?,
            topic: topic.to_owned(),
            marked,
            ends,
        }))
    }

    /// The next `limit` copies at most that no marker names.
    fn next(&mut self, limit: usize) -> Result<Vec<DeadLetter>, BrokerError> {
        let mut out = Vec::new();
        let started = Instant::now();
        while out.len() < limit && !self.ends.is_empty() {
            if started.elapsed() > READ_TIMEOUT {
                return Err(BrokerError::broker(
                    format!("reading {}", self.topic),
                    "the records read before did not come again",
                ));
            }
            let Some(record) = self.consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            let record = record.map_err(|e| classify(format!("reading {}", self.topic), e))?;
            let (partition, offset) = (record.partition(), record.offset());
            let Some(&end) = self.ends.get(&partition) else {
                continue;
            };
            if offset >= end {
                self.ends.remove(&partition);
            }
            if offset > end
                || self.marked.contains(&(partition, offset))
                || header(&record, SETTLED_HEADER).is_some()
            {
                continue;
            }
            out.push(letter(&record));
        }
        Ok(out)
    }
}

/// The partitions of `topic` that hold records, each with its high watermark, as the
/// broker lists them (asked through the producer).
fn partitions(producer: &FutureProducer, topic: &str) -> Result<Vec<(i32, i64)>, BrokerError> {
    let client = producer.client();
    let metadata = client
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map_err(|e| classify(format!("looking up topic {topic}"), e))?;
    let ids: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if ids.is_empty() {
        return Err(BrokerError::refused(
            format!("looking up topic {topic}"),
            "the broker lists no partition of it: is the dead-letter topic's name right?",
        ));
    }
    let mut partitions = Vec::with_capacity(ids.len());
    for id in ids {
        let (low, high) = client
            .fetch_watermarks(topic, id, Duration::from_secs(10))
            .map_err(|e| classify(format!("looking up the offsets of {topic}/{id}"), e))?;
        if high > low {
            partitions.push((id, high));
        }
    }
    Ok(partitions)
}

/// A consumer of `partitions` of `topic` from their start, committing nothing.
fn consumer(
    settings: &ClientConfig,
    topic: &str,
    partitions: &[i32],
) -> Result<BaseConsumer, BrokerError> {
    let consumer: BaseConsumer = settings
        .clone()
        .set("group.id", "dedup-replay")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("fetch.wait.max.ms", "100")
        .create()
        .map_err(|e| classify("creating the Kafka reader of dead letters", e))?;
    let mut tpl = TopicPartitionList::new();
    for &partition in partitions {
        tpl.add_partition_offset(topic, partition, Offset::Beginning)
            .map_err(|e| classify("building the partitions to read", e))?;
    }
    consumer
        .assign(&tpl)
        .map_err(|e| classify(format!("reading {topic}"), e))?;
    Ok(consumer)
}

/// The UTF-8 value of `record`'s header `name`.
fn header<'a>(record: &'a BorrowedMessage<'_>, name: &str) -> Option<&'a str> {
    let headers = record.headers()?;
    headers
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| std::str::from_utf8(h.value?).ok())
}

/// A dead-letter record as a [`DeadLetter`].
fn letter(record: &BorrowedMessage<'_>) -> DeadLetter {
    let mut headers = Vec::new();
    let mut message_id = None;
    if let Some(h) = record.headers() {
        for header in h.iter() {
            let Some(value) = header.value.and_then(|v| std::str::from_utf8(v).ok()) else {
                continue;
            };
            if header.key == MESSAGE_ID_HEADER {
                message_id = Some(value.to_owned());
            } else {
                headers.push((header.key.to_owned(), value.to_owned()));
            }
        }
    }
    let origin = headers
        .iter()
        .find(|(n, _)| n == ORIGIN_HEADER)
        .and_then(|(_, v)| parse_origin(v))
        .map_or_else(
            || "an unknown topic".to_owned(),
            |(topic, partition)| format!("topic {topic:?}, partition {partition}"),
        );
    DeadLetter {
        message_id,
        headers,
        payload: record
            .payload()
            .map(Bytes::copy_from_slice)
            .unwrap_or_default(),
        origin,
        key: record.key().map(Bytes::copy_from_slice),
        place: format!("{}/{}", record.partition(), record.offset()),
    }
}
