//! Replay: put dead-lettered copies back where they came from, once each.
//!
//! A consumer dead-letters a message with the `dedup-failure-*` headers
//! ([`Fault`](crate::Fault)) and the broker's origin (the exchange and routing key,
//! stream, subject or topic it was read from). After the fix, an operator replays it:
//! [`replay`] reads the dead letters through a broker's [`DeadLetters`], and for each
//! picked copy:
//!
//! 1. reads the key's record: a key processed since (a live redelivery, an earlier replay)
//!    has its copy settled and is not published again;
//! 2. forgets a failed or dead-lettered key, so the next delivery runs the handler;
//! 3. republishes the copy to its origin, with its message id, payload and headers, and
//!    waits for the broker's confirm;
//! 4. settles the dead-letter copy, only then.
//!
//! A replay cannot double. Every republished copy keeps its message id, so the inbox
//! admits one of them. A replay run twice, or raced with a redelivery, thus runs the
//! handler once. A crash between the steps leaves the copy among the dead letters, and the
//! next replay finishes the job.
//!
//! [`plan`] is the dry run: it reads the same copies and decides each the same way, but
//! forgets, republishes and settles nothing.

use std::collections::BTreeSet;

use async_trait::async_trait;
use bytes::Bytes;
use dedup_core::{Admin, Forgot, Key, RecordState, Status};

use crate::BrokerError;
use crate::fault::{
    FAILURE_ATTEMPTS_HEADER, FAILURE_CONSUMER_HEADER, FAILURE_KIND_HEADER, FAILURE_MESSAGE_HEADER,
    FAILURE_TIME_HEADER,
};

/// One dead-lettered copy, read back from the broker's dead letters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// The message id the copy kept (the broker's id property), if any. A delivery
    /// refused for lack of one cannot be replayed.
    pub message_id: Option<String>,
    /// The copy's headers, failure headers included, in the broker's order.
    pub headers: Vec<(String, String)>,
    /// The payload, as the consumer received it.
    pub payload: Bytes,
    /// Where a replay publishes it: the broker's name for the origin, for messages
    /// (`exchange "orders", routing key "order.created"`, a topic, a stream, a subject).
    pub origin: String,
    /// The record key (Kafka), kept so a replayed record lands on its key's partition; or
    /// the ordering key (Pub/Sub), kept so a replayed message keeps it.
    pub key: Option<Bytes>,
    /// The copy's place among the dead letters (a delivery tag, an entry id, a stream
    /// sequence, `partition/offset`): what [`DeadLetters::settle`] removes.
    pub place: String,
}

impl DeadLetter {
    /// The first header named `name` (exact match), if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The consumer that dead-lettered it (the `dedup-failure-consumer` header).
    pub fn consumer(&self) -> Option<&str> {
        self.header(FAILURE_CONSUMER_HEADER)
    }

    /// The failure the copy carries: kind, message, attempts and time, as the headers say
    /// (`None` for a copy without `dedup-failure-kind`).
    pub fn failure(&self) -> Option<FailureHeaders<'_>> {
        Some(FailureHeaders {
            kind: self.header(FAILURE_KIND_HEADER)?,
            message: self.header(FAILURE_MESSAGE_HEADER).unwrap_or(""),
            attempts: self
                .header(FAILURE_ATTEMPTS_HEADER)
                .and_then(|a| a.parse().ok()),
            time: self.header(FAILURE_TIME_HEADER),
        })
    }

    /// The headers a replayed copy carries: its own, without the `dedup-failure-*` headers
    /// and the dead-letter reason. A broker's [`DeadLetters::republish`] drops its own
    /// bookkeeping headers too.
    pub fn replay_headers(&self) -> Vec<(String, String)> {
        self.headers
            .iter()
            .filter(|(n, _)| !is_dead_letter_header(n))
            .cloned()
            .collect()
    }
}

/// Whether `name` is a header the consumer adds when it dead-letters a copy.
pub fn is_dead_letter_header(name: &str) -> bool {
    name.starts_with("dedup-failure-") || name == crate::DEAD_LETTER_REASON
}

/// The failure headers of a [`DeadLetter`], as written by the consumer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailureHeaders<'a> {
    /// What failed (`handler`, `refused`, ...).
    pub kind: &'a str,
    /// The error chain.
    pub message: &'a str,
    /// Attempts counted, if the header parses.
    pub attempts: Option<u32>,
    /// When it was dead-lettered (RFC 3339), if the copy says.
    pub time: Option<&'a str>,
}

/// One broker endpoint's dead letters: the queue, stream, subject or topic a consumer
/// dead-letters to. A value is one reading session: the copies it took stay held (not
/// redelivered to anyone else, where the broker holds) until they are settled or given
/// back.
#[async_trait]
pub trait DeadLetters: Send {
    /// Where the dead letters are, for messages (`RabbitMQ queue "orders.dead"`).
    fn describe(&self) -> String;

    /// Takes the next `limit` copies at most, oldest first, settling none. An empty answer:
    /// no copy is left to read in this session.
    async fn take(&mut self, limit: usize) -> Result<Vec<DeadLetter>, BrokerError>;

    /// Publishes `letter` to its origin, with its message id, payload,
    /// [`replay_headers`](DeadLetter::replay_headers) and key, and waits until the broker
    /// confirms it.
    async fn republish(&mut self, letter: &DeadLetter) -> Result<(), BrokerError>;

    /// Removes `letter`, taken in this session, from the dead letters.
    async fn settle(&mut self, letter: &DeadLetter) -> Result<(), BrokerError>;

    /// Gives back every copy taken and not settled, for later readers. Also done when the
    /// session is dropped, as far as the broker allows.
    async fn give_back(&mut self) -> Result<(), BrokerError>;
}

/// Which dead-lettered messages of one consumer a replay puts back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pick {
    /// Those with these message ids (one key, or a failure group's keys).
    Ids(BTreeSet<String>),
    /// Every copy of the consumer.
    All,
}

impl Pick {
    /// Whether a copy with `message_id` is picked.
    pub fn picks(&self, message_id: &str) -> bool {
        match self {
            Pick::Ids(ids) => ids.contains(message_id),
            Pick::All => true,
        }
    }
}

/// What a replay did with each copy it read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Copies republished, confirmed and settled: their keys run again. From [`plan`]: the
    /// copies a replay would republish.
    pub replayed: Vec<String>,
    /// Copies of keys processed since they were dead-lettered: settled, not republished.
    pub already_processed: Vec<String>,
    /// Picked copies left among the dead letters, each with why (a live lease, a copy
    /// without a message id).
    pub left: Vec<(String, String)>,
    /// Copies read that were not picked (another consumer's, another key): given back.
    pub not_picked: u64,
}

/// Why a replay stopped. What it did before is in `done`.
#[derive(Debug, thiserror::Error)]
#[error("replay stopped after {} replayed: {step}", done.replayed.len())]
pub struct ReplayError {
    /// What failed, and for which message.
    pub step: String,
    /// What the replay did before it stopped.
    pub done: ReplayReport,
    /// The broker's or the store's error.
    #[source]
    pub source: dedup_core::BoxError,
}

/// How many copies a replay reads per [`DeadLetters::take`].
pub const REPLAY_BATCH: usize = 100;

/// Replays the copies of `consumer` that `pick` picks, from `dead`, through `admin` (the
/// consumer's store). See the [module docs](self) for the steps and why it cannot double.
///
/// It reads until the dead letters are exhausted, at most `max_read` copies (the picked
/// and the others), then gives back what it did not settle.
///
/// # Errors
///
/// [`ReplayError`] at the first failed step (store, republish, settle). Copies not yet
/// settled are given back; the report says what was done.
pub async fn replay(
    dead: &mut dyn DeadLetters,
    admin: &dyn Admin,
    consumer: &str,
    pick: &Pick,
    max_read: usize,
) -> Result<ReplayReport, ReplayError> {
    run(dead, admin, consumer, pick, max_read, Mode::Replay).await
}

/// What [`replay`] would do with the same copies, done to none of them: the report's
/// `replayed` are the copies it would republish. Every copy read is given back.
///
/// The decision per copy is [`replay`]'s own: a copy is left or skipped for the same
/// reasons. A delivery or another replay may still change a key between the plan and the
/// replay.
///
/// # Errors
///
/// [`ReplayError`] when reading the dead letters or the store fails.
pub async fn plan(
    dead: &mut dyn DeadLetters,
    admin: &dyn Admin,
    consumer: &str,
    pick: &Pick,
    max_read: usize,
) -> Result<ReplayReport, ReplayError> {
    run(dead, admin, consumer, pick, max_read, Mode::Plan).await
}

/// Whether a run acts on what it decides.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Forget, republish and settle.
    Replay,
    /// Decide only.
    Plan,
}

async fn run(
    dead: &mut dyn DeadLetters,
    admin: &dyn Admin,
    consumer: &str,
    pick: &Pick,
    max_read: usize,
    mode: Mode,
) -> Result<ReplayReport, ReplayError> {
    let mut report = ReplayReport::default();
    let result = replay_each(dead, admin, consumer, pick, max_read, mode, &mut report).await;
    let given_back = dead.give_back().await;
    match (result, given_back) {
        (Err((step, source)), _) => Err(ReplayError {
            step,
            done: report,
            source,
        }),
        (Ok(()), Err(e)) => Err(ReplayError {
            step: format!("giving back the copies not replayed to {}", dead.describe()),
            done: report,
            source: e.into(),
        }),
        (Ok(()), Ok(())) => Ok(report),
    }
}

type Step = (String, dedup_core::BoxError);

async fn replay_each(
    dead: &mut dyn DeadLetters,
    admin: &dyn Admin,
    consumer: &str,
    pick: &Pick,
    max_read: usize,
    mode: Mode,
    report: &mut ReplayReport,
) -> Result<(), Step> {
    let mut read = 0;
    while read < max_read {
        let batch = dead
            .take(REPLAY_BATCH.min(max_read - read))
            .await
            .map_err(|e| (format!("reading {}", dead.describe()), e.into()))?;
        if batch.is_empty() {
            break;
        }
        read += batch.len();
        for letter in batch {
            replay_one(dead, admin, consumer, pick, &letter, mode, report).await?;
        }
    }
    Ok(())
}

async fn replay_one(
    dead: &mut dyn DeadLetters,
    admin: &dyn Admin,
    consumer: &str,
    pick: &Pick,
    letter: &DeadLetter,
    mode: Mode,
    report: &mut ReplayReport,
) -> Result<(), Step> {
    if letter.consumer() != Some(consumer) {
        report.not_picked += 1;
        return Ok(());
    }
    let Some(id) = letter.message_id.as_deref() else {
        if matches!(pick, Pick::All) {
            let why = "it has no message id: it was refused, not handled".to_owned();
            report.left.push((letter.place.clone(), why));
        } else {
            report.not_picked += 1;
        }
        return Ok(());
    };
    if !pick.picks(id) {
        report.not_picked += 1;
        return Ok(());
    }
    let key = Key::new(consumer, id).map_err(|e| (format!("the key of {id}"), e.into()))?;
    let record = admin
        .get(&key)
        .await
        .map_err(|e| (format!("reading {key}"), e.into()))?;
    // A lease live or run out is left alike (a redelivery takes an expired one over), so
    // the store's clock is not read.
    let status = record.map(|r| match r.state {
        RecordState::InFlight { .. } => Status::InFlight,
        RecordState::Completed { outcome, .. } => Status::of_outcome(outcome.as_deref()),
    });
    match status {
        Some(Status::Completed) => {
            if mode == Mode::Replay {
                settle(dead, letter, &key).await?;
            }
            report.already_processed.push(id.to_owned());
            return Ok(());
        }
        Some(Status::InFlight | Status::Expired) => {
            let why = "its key is in flight: a delivery is running it".to_owned();
            report.left.push((id.to_owned(), why));
            return Ok(());
        }
        Some(Status::Failed | Status::DeadLettered) if mode == Mode::Replay => {
            match admin
                .forget(&key, false)
                .await
                .map_err(|e| (format!("forgetting {key}"), e.into()))?
            {
                Forgot::Forgot { .. } | Forgot::NotFound => {}
                Forgot::LiveLease { .. } => {
                    let why = "its key is in flight: a delivery took it meanwhile".to_owned();
                    report.left.push((id.to_owned(), why));
                    return Ok(());
                }
            }
        }
        Some(Status::Failed | Status::DeadLettered) | None => {}
    }
    if mode == Mode::Plan {
        report.replayed.push(id.to_owned());
        return Ok(());
    }
    dead.republish(letter)
        .await
        .map_err(|e| (format!("republishing {key} to {}", letter.origin), e.into()))?;
    settle(dead, letter, &key).await?;
    tracing::info!(key = %key, origin = %letter.origin, "dedup replay: republished");
    report.replayed.push(id.to_owned());
    Ok(())
}

async fn settle(dead: &mut dyn DeadLetters, letter: &DeadLetter, key: &Key) -> Result<(), Step> {
    dead.settle(letter).await.map_err(|e| {
        let step = format!(
            "settling the copy of {key} at {} in {}",
            letter.place,
            dead.describe()
        );
        (step, e.into())
    })
}

/// `url` without its query parameter `name`, and that parameter's value, percent-decoded:
/// what a broker's opener reads (`?queue=`, `?stream=`, `?topic=`, `?subscription=`). The
/// other parameters stay in the URL for the broker's client.
///
/// # Errors
///
/// [`BrokerError::Config`] when the parameter is missing, empty or not UTF-8 once decoded.
pub fn url_param(url: &str, name: &str) -> Result<(String, String), BrokerError> {
    let missing = || BrokerError::Config(format!("the dead letters' URL needs ?{name}=NAME"));
    let (base, query) = url.split_once('?').ok_or_else(missing)?;
    let mut value = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some((n, v)) if n == name => value = Some(percent_decode(v)?),
            _ => kept.push(pair),
        }
    }
    let value = value.filter(|v| !v.is_empty()).ok_or_else(missing)?;
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, value))
}

/// `text` with each `%XX` decoded.
fn percent_decode(text: &str) -> Result<String, BrokerError> {
    let bad = || BrokerError::Config(format!("{text:?} is not a valid percent-encoded value"));
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = tail.get(..2).and_then(|h| std::str::from_utf8(h).ok());
            let byte = hex
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(bad)?;
            bytes.push(byte);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).map_err(|_| bad())
}

/// Opens the dead letters `url` names, for a replay or the console's message view. The
/// scheme picks the broker (each behind its feature):
///
/// | scheme | dead letters |
/// |---|---|
/// | `amqp://`, `amqps://` | `?queue=` the dead-letter queue |
/// | `redis://`, `rediss://` | `?stream=` the consumed stream (its `<stream>:dead`) |
/// | `nats://` | `?stream=` the JetStream stream capturing the dead-letter subject |
/// | `kafka://` | `?topic=` the dead-letter topic |
/// | `pubsub://PROJECT` | `?subscription=` a subscription of the dead-letter topic |
///
/// # Errors
///
/// [`BrokerError::Config`] for a URL no enabled broker opens; the broker's error when it
/// cannot connect.
#[allow(clippy::match_single_binding)] // without a broker feature, only the refusal is left
pub async fn open(url: &str) -> Result<Box<dyn DeadLetters>, BrokerError> {
    let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
    match scheme {
        #[cfg(feature = "redis-streams")]
        "redis" | "rediss" => Ok(Box::new(
            crate::redis_streams::StreamDeadLetters::open(url).await?,
        )),
        #[cfg(feature = "rabbitmq")]
        "amqp" | "amqps" => Ok(Box::new(
            crate::rabbitmq::RabbitDeadLetters::open(url).await?,
        )),
        #[cfg(feature = "nats")]
        "nats" => Ok(Box::new(crate::nats::NatsDeadLetters::open(url).await?)),
        #[cfg(feature = "kafka")]
        "kafka" => Ok(Box::new(crate::kafka::KafkaDeadLetters::open(url)?)),
        #[cfg(feature = "pubsub")]
        "pubsub" => Ok(Box::new(crate::pubsub::PubSubDeadLetters::open(url).await?)),
        _ => Err(BrokerError::Config(format!(
            "no dead letters for the scheme {scheme:?}: the known ones are amqp, amqps, \
             redis, rediss, nats, kafka and pubsub, each with its broker's feature"
        ))),
    }
}
