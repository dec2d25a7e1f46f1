//! [`RabbitConsumer`]: a queue's deliveries through a [`Handle`], with manual acks.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    BasicRejectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Acker, BasicProperties, Channel};

use super::RabbitPublisher;
use super::publisher::confirmed;
use crate::action::{Counters, decide};
use crate::in_flight::InFlight;
use crate::{
    Action, BrokerError, ConsumerConfig, ConsumerStats, DEAD_LETTER_REASON, Delivery, Handle,
    Shutdown,
};

/// Where a [`RabbitConsumer`] sends dead letters.
#[derive(Clone, Debug, Default)]
pub enum DeadLetters {
    /// `basic.reject` without requeue: RabbitMQ moves the message to the queue's
    /// dead-letter exchange (`x-dead-letter-exchange`), or drops it if the queue has none.
    /// The reason is only logged (RabbitMQ's `x-death` header says `rejected`).
    #[default]
    QueueDlx,
    /// Publish a copy (same message id, headers and payload, plus the reason in
    /// [`DEAD_LETTER_REASON`]) to `destination` (`exchange` or `exchange/routing-key`) with
    /// `publisher`, wait for the broker's confirm, then ack the original. If the publish
    /// fails the original is requeued after `retry_delay`.
    Publish {
        /// The publisher (its own confirm channel).
        publisher: RabbitPublisher,
        /// Where the copy goes.
        destination: String,
    },
}

/// Consumes a queue with manual acks: prefetch = [`ConsumerConfig::in_flight`], each
/// delivery's key from its AMQP `message_id`, the consumer name from the queue by default.
///
/// Actions: ack; a retry is a `basic.nack` with requeue sent after the delay (AMQP has no
/// delayed requeue: the delivery keeps its in-flight slot while it waits, and a shutdown
/// ends the wait at once); dead letters per [`DeadLetters`].
#[derive(Debug)]
pub struct RabbitConsumer {
    channel: Channel,
    queue: String,
    config: ConsumerConfig,
    dead_letters: DeadLetters,
}

impl RabbitConsumer {
    /// A consumer of `queue` on `channel` (which it sets `basic.qos` on).
    pub fn new(channel: Channel, queue: impl Into<String>, config: ConsumerConfig) -> Self {
        RabbitConsumer {
            channel,
            queue: queue.into(),
            config,
            dead_letters: DeadLetters::default(),
        }
    }

    /// Where dead letters go (default: the queue's dead-letter exchange).
    pub fn dead_letters(mut self, dead_letters: DeadLetters) -> Self {
        self.dead_letters = dead_letters;
        self
    }

    /// Consume until `shutdown` fires (then: stop consuming, let started handlers finish
    /// and settle, requeue what was prefetched but not started) or the channel closes (an
    /// error). Returns the counts of what happened.
    pub async fn run<H: Handle>(
        self,
        handler: H,
        shutdown: Shutdown,
    ) -> Result<ConsumerStats, BrokerError> {
        self.config.check()?;
        let prefetch = u16::try_from(self.config.in_flight)
            .map_err(|_| BrokerError::Config("in_flight above 65535 (AMQP prefetch)".into()))?;
        self.channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| BrokerError::broker("basic.qos", e))?;
        let mut consumer = self
            .channel
            .basic_consume(
                self.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| BrokerError::broker(format!("basic.consume on {}", self.queue), e))?;
        let shared = Arc::new(Shared {
            consumer: self.config.consumer_name(&self.queue).to_owned(),
            config: self.config.clone(),
            dead_letters: self.dead_letters,
            handler,
            counters: Counters::default(),
            shutdown: shutdown.clone(),
        });
        let mut in_flight = InFlight::new(self.config.in_flight);
        let mut failure = None;
        while let Some(permit) = in_flight.slot(&shutdown).await {
            let next = tokio::select! {
                biased;
                _ = shutdown.wait() => break,
                next = consumer.next() => next,
            };
            match next {
                Some(Ok(delivery)) => {
                    let shared = Arc::clone(&shared);
                    in_flight
                        .start(permit, async move { shared.settle(delivery).await })
                        .await;
                }
                Some(Err(e)) => {
                    failure = Some(BrokerError::broker("consuming", e));
                    break;
                }
                None => {
                    failure = Some(BrokerError::broker(
                        "consuming",
                        format!("the consumer of {} was closed", self.queue),
                    ));
                    break;
                }
            }
        }
        // Stop deliveries, let the started handlers settle, then requeue the prefetched
        // rest (the stream ends after the cancel).
        let cancelled = self
            .channel
            .basic_cancel(consumer.tag(), BasicCancelOptions::default())
            .await;
        in_flight.drain().await;
        if cancelled.is_ok() && failure.is_none() {
            let requeue = async {
                while let Some(Ok(d)) = consumer.next().await {
                    let _ = d.acker.nack(requeue()).await;
                }
            };
            // Whatever is not nacked in time is requeued by the broker when the channel
            // closes.
            let _ = tokio::time::timeout(Duration::from_secs(2), requeue).await;
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(shared.counters.snapshot()),
        }
    }
}

fn requeue() -> BasicNackOptions {
    BasicNackOptions {
        requeue: true,
        ..BasicNackOptions::default()
    }
}

struct Shared<H> {
    consumer: String,
    config: ConsumerConfig,
    dead_letters: DeadLetters,
    handler: H,
    counters: Counters,
    shutdown: Shutdown,
}

impl<H: Handle> Shared<H> {
    async fn settle(&self, amqp: AmqpDelivery) {
        let delivery = delivery(&amqp);
        let action = decide(
            &self.handler,
            &self.consumer,
            &delivery,
            &self.config,
            &self.counters,
        )
        .await;
        let acker = &amqp.acker;
        let settled = match action {
            Action::Ack => acker.ack(BasicAckOptions::default()).await.map(drop),
            Action::Retry { delay } => self.requeue_after(acker, delay).await,
            Action::DeadLetter { reason } => match &self.dead_letters {
                DeadLetters::QueueDlx => acker
                    .reject(BasicRejectOptions { requeue: false })
                    .await
                    .map(drop),
                DeadLetters::Publish {
                    publisher,
                    destination,
                } => {
                    let copied = async {
                        let mut headers: Vec<(&str, &str)> = delivery
                            .headers
                            .iter()
                            .map(|(n, v)| (n.as_str(), v.as_str()))
                            .collect();
                        headers.push((DEAD_LETTER_REASON, &reason));
                        let id = delivery.message_id.as_deref().unwrap_or("");
                        let confirm = publisher.send(destination, id, headers, &amqp.data).await?;
                        confirmed(destination, confirm).await
                    };
                    match copied.await {
                        Ok(()) => acker.ack(BasicAckOptions::default()).await.map(drop),
                        Err(e) => {
                            tracing::warn!(error = %e, "dead letter not published; requeueing");
                            Counters::bump(&self.counters.settle_errors);
                            self.requeue_after(acker, self.config.retry_delay).await
                        }
                    }
                }
            },
        };
        if let Err(e) = settled {
            // The channel is gone: the broker requeues the delivery by itself.
            tracing::warn!(error = %e, "could not settle a delivery");
            Counters::bump(&self.counters.settle_errors);
        }
    }

    async fn requeue_after(&self, acker: &Acker, delay: Duration) -> Result<(), lapin::Error> {
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = self.shutdown.wait() => {}
        }
        acker.nack(requeue()).await.map(drop)
    }
}

fn delivery(d: &AmqpDelivery) -> Delivery {
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
