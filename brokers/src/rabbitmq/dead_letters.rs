//! [`RabbitDeadLetters`]: a dead-letter queue's messages, read back for a replay.

use std::collections::BTreeMap;

use async_trait::async_trait;
use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Acker, Channel, Connection, ConnectionProperties};

use super::errors::classify;
use super::pending::{delivery, requeue};
use super::{ORIGIN_HEADER, RabbitPublisher};
use crate::replay::{DeadLetter, DeadLetters};
use crate::{BrokerError, FAILURE_CONSUMER_HEADER};

/// RabbitMQ's header listing where a message was dead-lettered from, newest first.
const X_DEATH: &str = "x-death";

/// The dead letters of a RabbitMQ dead-letter queue (a [`Topology`](super::Topology)'s
/// `<queue>.dead`, or a [`DeadLetters::Publish`](super::DeadLetters::Publish) destination's
/// queue).
///
/// - Take: `basic.get` with manual acks, on one channel. A copy taken stays unacked, so
///   no other reader gets it while the session holds it.
/// - Origin: the copy's [`ORIGIN_HEADER`] (a copy the consumer published), else the first
///   entry of RabbitMQ's `x-death` header (a copy the queue dead-lettered): its exchange
///   and first routing key. It is a destination, `exchange/routing-key`.
/// - Republish: to the origin, through a [`RabbitPublisher`] on the session's connection
///   (confirms on, `mandatory`). The copy keeps its message id, payload and headers, less
///   the failure headers, the reason, [`ORIGIN_HEADER`] and RabbitMQ's `x-death`,
///   `x-first-death-*` and `x-last-death-*`. It gets a new timestamp, so the consumer's
///   admission floor takes it.
/// - Settle: `basic.ack` of the copy.
/// - Give back: `basic.nack` with requeue of every copy held. A dropped session's copies
///   go back when RabbitMQ sees its connection close.
///
/// A queue's dead-letter exchange cannot add the failure headers: a rejected copy carries
/// none. Its consumer is taken to be the queue it was rejected from (`x-death`'s queue),
/// the consumer's default name, and written as [`FAILURE_CONSUMER_HEADER`]. A consumer
/// with another name ([`ConsumerConfig::consumer`](crate::ConsumerConfig::consumer))
/// dead-letters by publishing to be replayed.
pub struct RabbitDeadLetters {
    /// The connection opened by [`open`](Self::open), kept open for the session.
    _connection: Option<Connection>,
    channel: Channel,
    publisher: RabbitPublisher,
    queue: String,
    /// The copies taken and not settled, by delivery tag.
    held: BTreeMap<u64, Acker>,
}

impl std::fmt::Debug for RabbitDeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitDeadLetters")
            .field("queue", &self.queue)
            .field("held", &self.held.len())
            .finish_non_exhaustive()
    }
}

impl RabbitDeadLetters {
    /// The dead letters in `queue`, read and republished over two new channels of
    /// `connection`.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Refused`] when `queue` does not exist; the client's error when a
    /// channel cannot be opened.
    pub async fn new(
        connection: &Connection,
        queue: impl Into<String>,
    ) -> Result<Self, BrokerError> {
        let queue = queue.into();
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| classify("opening a channel for the dead letters", e))?;
        let passive = lapin::options::QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        channel
            .queue_declare(queue.as_str().into(), passive, FieldTable::default())
            .await
            .map_err(|e| classify(format!("queue {queue}"), e))?;
        let publisher = RabbitPublisher::new(connection)
            .await
            .map_err(|e| classify("opening the replay's confirm channel", e))?;
        Ok(RabbitDeadLetters {
            _connection: None,
            channel,
            publisher,
            queue,
            held: BTreeMap::new(),
        })
    }

    /// Opens `url`: an AMQP URL with `?queue=` naming the dead-letter queue, on a
    /// connection of its own.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Config`] for a URL without the queue; as [`new`](Self::new), and the
    /// client's error when it cannot connect.
    pub async fn open(url: &str) -> Result<Self, BrokerError> {
        let (url, queue) = crate::replay::url_param(url, "queue")?;
        let connection = super::errors::connect(&url, ConnectionProperties::default())
            .await
            .map_err(|e| classify("connecting to RabbitMQ for the dead letters", e))?;
        let mut letters = Self::new(&connection, queue).await?;
        letters._connection = Some(connection);
        Ok(letters)
    }

    /// One copy taken, as a [`DeadLetter`], its acker kept.
    fn letter(&mut self, amqp: lapin::message::Delivery) -> DeadLetter {
        let read = delivery(&amqp);
        let death = amqp.properties.headers().as_ref().and_then(first_death);
        let mut headers = read.headers;
        if let Some(queue) = death.as_ref().map(|d| &d.queue)
            && !headers.iter().any(|(n, _)| n == FAILURE_CONSUMER_HEADER)
        {
            headers.push((FAILURE_CONSUMER_HEADER.to_owned(), queue.clone()));
        }
        let origin = headers
            .iter()
            .find(|(n, _)| n == ORIGIN_HEADER)
            .map(|(_, v)| v.clone())
            .or_else(|| death.map(|d| format!("{}/{}", d.exchange, d.routing_key)))
            .unwrap_or_default();
        self.held.insert(amqp.delivery_tag, amqp.acker);
        DeadLetter {
            message_id: read.message_id,
            headers,
            payload: read.payload,
            origin,
            key: None,
            place: amqp.delivery_tag.to_string(),
        }
    }

    /// The acker of the copy at `letter`'s place, taken in this session.
    fn held(&mut self, letter: &DeadLetter) -> Result<Acker, BrokerError> {
        letter
            .place
            .parse()
            .ok()
            .and_then(|tag| self.held.remove(&tag))
            .ok_or_else(|| {
                BrokerError::Config(format!(
                    "delivery {} of {} was not taken in this session, or is settled",
                    letter.place, self.queue
                ))
            })
    }
}

/// The newest entry of a copy's `x-death` header.
struct Death {
    queue: String,
    exchange: String,
    routing_key: String,
}

fn first_death(headers: &FieldTable) -> Option<Death> {
    let AMQPValue::FieldArray(deaths) = headers.inner().get(X_DEATH)? else {
        return None;
    };
    let AMQPValue::FieldTable(death) = deaths.as_slice().first()? else {
        return None;
    };
    let field = |name: &str| text(death.inner().get(name)?);
    let routing_key = match death.inner().get("routing-keys") {
        Some(AMQPValue::FieldArray(keys)) => keys.as_slice().first().and_then(text),
        _ => None,
    };
    Some(Death {
        queue: field("queue")?,
        exchange: field("exchange")?,
        routing_key: routing_key.unwrap_or_default(),
    })
}

fn text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// Whether `name` is RabbitMQ's or this crate's bookkeeping, which a replay drops.
fn is_bookkeeping(name: &str) -> bool {
    name == ORIGIN_HEADER
        || name == X_DEATH
        || name.starts_with("x-first-death-")
        || name.starts_with("x-last-death-")
}

#[async_trait]
impl DeadLetters for RabbitDeadLetters {
    fn describe(&self) -> String {
        format!("RabbitMQ queue {:?}", self.queue)
    }

    async fn take(&mut self, limit: usize) -> Result<Vec<DeadLetter>, BrokerError> {
        let mut taken = Vec::new();
        while taken.len() < limit {
            let got = self
                .channel
                .basic_get(
                    self.queue.as_str().into(),
                    BasicGetOptions { no_ack: false },
                )
                .await
                .map_err(|e| classify(format!("basic.get from {}", self.queue), e))?;
            let Some(got) = got else { break };
            taken.push(self.letter(got.delivery));
        }
        Ok(taken)
    }

    async fn republish(&mut self, letter: &DeadLetter) -> Result<(), BrokerError> {
        let context = || format!("republishing to {}", letter.origin);
        let id = letter.message_id.as_deref().ok_or_else(|| {
            BrokerError::Config(format!("the copy at {} has no message id", letter.place))
        })?;
        if letter.origin.is_empty() {
            return Err(BrokerError::Config(format!(
                "the copy of {id} says not where it came from (no {ORIGIN_HEADER}, no {X_DEATH})"
            )));
        }
        let headers = letter.replay_headers();
        let kept = headers
            .iter()
            .filter(|(n, _)| !is_bookkeeping(n))
            .map(|(n, v)| (n.as_str(), v.as_str()));
        let deadline = self.publisher.confirm_deadline();
        let confirm = self
            .publisher
            .send(&letter.origin, id, kept, &letter.payload)
            .await
            .map_err(|e| BrokerError::broker(context(), e))?;
        self.publisher
            .confirmed(&letter.origin, confirm, deadline)
            .await
            .map_err(|e| BrokerError::broker(context(), e))
    }

    async fn settle(&mut self, letter: &DeadLetter) -> Result<(), BrokerError> {
        let acker = self.held(letter)?;
        let what = format!("basic.ack of {} in {}", letter.place, self.queue);
        match acker.ack(BasicAckOptions::default()).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(BrokerError::broker(what, "the channel closed first")),
            Err(e) => Err(classify(what, e)),
        }
    }

    async fn give_back(&mut self) -> Result<(), BrokerError> {
        for (tag, acker) in std::mem::take(&mut self.held) {
            let what = || format!("basic.nack of {tag} in {}", self.queue);
            match acker.nack(requeue()).await {
                Ok(true) => {}
                Ok(false) => return Err(BrokerError::broker(what(), "the channel closed first")),
                Err(e) => return Err(classify(what(), e)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::{FieldArray, LongString};

    use super::*;

    fn long(s: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
    }

    #[test]
    fn the_newest_death_names_the_origin() {
        let death = |queue: &str, exchange: &str, key: &str| {
            let mut t = FieldTable::default();
            t.insert("queue".into(), long(queue));
            t.insert("exchange".into(), long(exchange));
            let keys = FieldArray::from(vec![long(key)]);
            t.insert("routing-keys".into(), AMQPValue::FieldArray(keys));
            AMQPValue::FieldTable(t)
        };
        let mut headers = FieldTable::default();
        let deaths = vec![
            death("orders", "shop", "order.created"),
            death("a", "b", "c"),
        ];
        headers.insert(X_DEATH.into(), AMQPValue::FieldArray(deaths.into()));
        let first = first_death(&headers).expect("an x-death entry");
        assert_eq!(
            (first.queue.as_str(), first.exchange.as_str()),
            ("orders", "shop")
        );
        assert_eq!(first.routing_key, "order.created");
        assert!(first_death(&FieldTable::default()).is_none());
        assert!(is_bookkeeping("x-first-death-reason") && !is_bookkeeping("tenant"));
    }
}
