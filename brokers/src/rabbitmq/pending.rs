//! [`RabbitPending`]: one AMQP delivery, and how it is acked, requeued or dead-lettered
//! ([`DeadLetters`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::AMQPValue;
use lapin::{Acker, BasicProperties};

use super::errors::classify;
use super::{ORIGIN_HEADER, RabbitPublisher};
use crate::{Action, BrokerError, DEAD_LETTER_REASON, Delivery, Pending, Shutdown};

/// Where a [`RabbitConsumer`](super::RabbitConsumer) sends dead letters.
#[derive(Clone, Debug, Default)]
pub enum DeadLetters {
    /// `basic.reject` without requeue: RabbitMQ moves the message to the queue's
    /// dead-letter exchange (`x-dead-letter-exchange`); it would drop it if the queue had
    /// none, so a consumer that owns its connection
    /// ([`RabbitConsumer::from_uri`](super::RabbitConsumer::from_uri)) refuses to start on
    /// such a queue ([`BrokerError::MissingTopology`]; see
    /// [`RabbitConsumer::declare`](super::RabbitConsumer::declare)). The reason is only
    /// logged (RabbitMQ's `x-death` header says `rejected`).
    #[default]
    QueueDlx,
    /// Publish a copy (same message id, headers and payload, plus the reason in
    /// [`DEAD_LETTER_REASON`] and where the original was published in [`ORIGIN_HEADER`]) to
    /// `destination` (`exchange` or `exchange/routing-key`) with `publisher`, wait for the
    /// broker's confirm, then ack the original. If the publish fails the original is
    /// requeued after `retry_delay`.
    Publish {
        /// The publisher (its own confirm channel).
        publisher: RabbitPublisher,
        /// Where the copy goes.
        destination: String,
    },
}

/// One AMQP delivery and its acker.
#[derive(Debug)]
pub struct RabbitPending {
    delivery: Delivery,
    /// Where it was published: `exchange/routing-key`.
    origin: String,
    acker: Acker,
    dead_letters: Arc<DeadLetters>,
    retry_delay: Duration,
}

#[async_trait]
impl Pending for RabbitPending {
    fn delivery(&self) -> &Delivery {
        &self.delivery
    }

    async fn settle(self, action: Action, shutdown: &Shutdown) -> Result<(), BrokerError> {
        let acker = &self.acker;
        match action {
            Action::Ack => answered("basic.ack", acker.ack(BasicAckOptions::default())).await,
            Action::Retry { delay } => requeue_after(acker, delay, shutdown).await,
            Action::DeadLetter { reason, headers } => match &*self.dead_letters {
                DeadLetters::QueueDlx => {
                    let rejected = acker.reject(BasicRejectOptions { requeue: false });
                    answered("basic.reject", rejected).await
                }
                DeadLetters::Publish {
                    publisher,
                    destination,
                } => match self.copy(publisher, destination, &reason, &headers).await {
                    Ok(()) => answered("basic.ack", acker.ack(BasicAckOptions::default())).await,
                    Err(e) => {
                        tracing::warn!(error = %dedup_core::error_chain(&*e), "dead letter not published; requeueing");
                        requeue_after(acker, self.retry_delay, shutdown).await?;
                        Err(BrokerError::broker(
                            format!("publishing a dead letter to {destination}"),
                            e,
                        ))
                    }
                },
            },
        }
    }
}

impl RabbitPending {
    pub(super) fn new(
        amqp: AmqpDelivery,
        dead_letters: Arc<DeadLetters>,
        retry_delay: Duration,
    ) -> Self {
        RabbitPending {
            delivery: delivery(&amqp),
            origin: format!("{}/{}", amqp.exchange, amqp.routing_key),
            acker: amqp.acker,
            dead_letters,
            retry_delay,
        }
    }

    async fn copy(
        &self,
        publisher: &RabbitPublisher,
        destination: &str,
        reason: &str,
        fault: &[(String, String)],
    ) -> Result<(), dedup_core::BoxError> {
        let d = &self.delivery;
        let mut headers: Vec<(&str, &str)> = d
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .filter(|(n, _)| *n != ORIGIN_HEADER && !fault.iter().any(|(f, _)| f == n))
            .collect();
        headers.push((DEAD_LETTER_REASON, reason));
        headers.push((ORIGIN_HEADER, &self.origin));
        headers.extend(fault.iter().map(|(n, v)| (n.as_str(), v.as_str())));
        let id = d.message_id.as_deref().unwrap_or("");
        let confirm = publisher.send(destination, id, headers, &d.payload).await?;
        let deadline = publisher.confirm_deadline();
        publisher.confirmed(destination, confirm, deadline).await
    }
}

async fn requeue_after(
    acker: &Acker,
    delay: Duration,
    shutdown: &Shutdown,
) -> Result<(), BrokerError> {
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = shutdown.wait() => {}
    }
    answered("basic.nack", acker.nack(requeue())).await
}

/// How long an ack, nack or reject may take to be sent. lapin sends it as a frame and
/// answers once the frame is written; an ack queued just as the connection died was seen
/// never to be answered (lapin 4.12; its issue #409 is the same for publishes), which held
/// the consumer's shutdown forever.
const SETTLE_LIMIT: Duration = Duration::from_secs(10);

/// An acker's answer as a settle, waited for [`SETTLE_LIMIT`] at most. lapin answers
/// `Ok(false)` when the delivery's channel closed before the frame could go: a settle that
/// did not happen, not a success. Either way RabbitMQ delivers the message again unless the
/// frame reached it, and the inbox answers the copy.
async fn answered(
    what: &str,
    answer: impl Future<Output = lapin::Result<bool>>,
) -> Result<(), BrokerError> {
    match tokio::time::timeout(SETTLE_LIMIT, answer).await {
        Ok(Ok(true)) => Ok(()),
        Ok(Ok(false)) => Err(BrokerError::broker(
            what,
            "not sent: the delivery's channel closed first; RabbitMQ delivers the message again",
        )),
        Ok(Err(e)) => Err(classify(what, e)),
        Err(_) => Err(BrokerError::broker(
            what,
            format!(
                "not reported sent within {SETTLE_LIMIT:?} (the connection was probably lost \
                 as it went); RabbitMQ delivers the message again if it did not get it"
            ),
        )),
    }
}

/// A `basic.nack` that puts the message back in the queue.
pub(super) fn requeue() -> BasicNackOptions {
    BasicNackOptions {
        requeue: true,
        ..BasicNackOptions::default()
    }
}

/// `d` as the receive loop sees it (string headers only).
pub(super) fn delivery(d: &AmqpDelivery) -> Delivery {
    let props: &BasicProperties = &d.properties;
    Delivery {
        message_id: props.message_id().as_ref().map(|s| s.as_str().to_owned()),
        payload: d.data.clone().into(),
        headers: props
            .headers()
            .as_ref()
            .map(|t| {
                t.inner()
                    .iter()
                    .filter_map(|(name, value)| {
                        let text = match value {
                            AMQPValue::LongString(s) => {
                                String::from_utf8_lossy(s.as_bytes()).into_owned()
                            }
                            AMQPValue::ShortString(s) => s.as_str().to_owned(),
                            _ => return None,
                        };
                        Some((name.as_str().to_owned(), text))
                    })
                    .collect()
            })
            .unwrap_or_default(),
        published_at: props
            .timestamp()
            .map(|secs| SystemTime::UNIX_EPOCH + Duration::from_secs(secs)),
        redelivered: d.redelivered,
        broker_ref: d.delivery_tag.to_string(),
    }
}
