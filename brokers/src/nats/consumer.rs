//! [`NatsConsumer`]: a durable pull consumer's messages through a [`Handle`].

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::{AckKind, Context, Message};
use futures::StreamExt;

use super::MSG_ID_HEADER;
use super::publisher::{headers, send};
use crate::action::{Counters, decide};
use crate::in_flight::InFlight;
use crate::{
    Action, BrokerError, ConsumerConfig, ConsumerStats, DEAD_LETTER_REASON, Delivery, Handle,
    Shutdown,
};

/// Consumes a JetStream stream through a durable pull consumer (created if missing, with
/// explicit acks and `max_ack_pending` = [`ConsumerConfig::in_flight`]). The inbox's
/// consumer name is the durable name by default; the message id is the `Nats-Msg-Id`
/// header; the broker timestamp is the time the stream stored the message.
///
/// Each round fetches at most its free in-flight slots (waiting up to 200 ms), so it never
/// holds a message it has not started. Actions: ack; a retry is `Nak(delay)`; a dead letter
/// is published (headers, payload, and the reason in [`DEAD_LETTER_REASON`]) to the
/// dead-letter subject, which a stream must capture, and once the stream acknowledged it the
/// original is `Term`inated (if that publish fails the original is `Nak`ed for a retry).
#[derive(Debug)]
pub struct NatsConsumer {
    js: Context,
    stream: String,
    durable: String,
    config: ConsumerConfig,
    dead_letter_subject: String,
    ack_wait: Duration,
}

impl NatsConsumer {
    /// A consumer of `stream` through durable consumer `durable`. Dead letters go to
    /// `<stream>.dead` unless [`dead_letter_subject`](Self::dead_letter_subject) says otherwise;
    /// `ack_wait` is 30 s.
    pub fn new(
        js: Context,
        stream: impl Into<String>,
        durable: impl Into<String>,
        config: ConsumerConfig,
    ) -> Self {
        let stream = stream.into();
        NatsConsumer {
            js,
            dead_letter_subject: format!("{stream}.dead"),
            stream,
            durable: durable.into(),
            config,
            ack_wait: Duration::from_secs(30),
        }
    }

    /// Where dead letters are published.
    pub fn dead_letter_subject(mut self, subject: impl Into<String>) -> Self {
        self.dead_letter_subject = subject.into();
        self
    }

    /// How long JetStream waits for an ack before redelivering (when it creates the
    /// durable consumer): longer than a handler runs.
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait;
        self
    }

    /// Consume until `shutdown` fires (then: stop fetching, let started handlers finish and
    /// settle) or JetStream fails (an error, after the started handlers settled).
    pub async fn run<H: Handle>(
        self,
        handler: H,
        shutdown: Shutdown,
    ) -> Result<ConsumerStats, BrokerError> {
        self.config.check()?;
        let stream = self
            .js
            .get_stream(&self.stream)
            .await
            .map_err(|e| BrokerError::broker(format!("stream {}", self.stream), e))?;
        let consumer: PullConsumer = stream
            .get_or_create_consumer(
                &self.durable,
                pull::Config {
                    durable_name: Some(self.durable.clone()),
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: self.ack_wait,
                    max_ack_pending: self.config.in_flight as i64,
                    ..pull::Config::default()
                },
            )
            .await
            .map_err(|e| BrokerError::broker(format!("durable consumer {}", self.durable), e))?;
        let shared = Arc::new(Shared {
            consumer: self.config.consumer_name(&self.durable).to_owned(),
            config: self.config.clone(),
            handler,
            counters: Counters::default(),
            js: self.js.clone(),
            dead_letter_subject: self.dead_letter_subject.clone(),
        });
        let mut in_flight = InFlight::new(self.config.in_flight);
        let mut failure = None;
        loop {
            let mut permits = in_flight.slots(&shutdown).await;
            if permits.is_empty() {
                break;
            }
            // Not cancelled on shutdown: what the server sends for this request is handled.
            let batch = consumer
                .batch()
                .max_messages(permits.len())
                .expires(Duration::from_millis(200))
                .messages()
                .await;
            let mut batch = match batch {
                Ok(batch) => batch,
                Err(e) => {
                    failure = Some(BrokerError::broker("fetching a batch", e));
                    break;
                }
            };
            while let Some(next) = batch.next().await {
                match next {
                    Ok(message) => {
                        let Some(permit) = permits.pop() else { break };
                        let shared = Arc::clone(&shared);
                        in_flight
                            .start(permit, async move { shared.settle(message).await })
                            .await;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "batch ended");
                        break;
                    }
                }
            }
        }
        in_flight.drain().await;
        match failure {
            Some(e) => Err(e),
            None => Ok(shared.counters.snapshot()),
        }
    }
}

struct Shared<H> {
    consumer: String,
    config: ConsumerConfig,
    handler: H,
    counters: Counters,
    js: Context,
    dead_letter_subject: String,
}

impl<H: Handle> Shared<H> {
    async fn settle(&self, message: Message) {
        let delivery = delivery(&message);
        let action = decide(
            &self.handler,
            &self.consumer,
            &delivery,
            &self.config,
            &self.counters,
        )
        .await;
        let kind = match action {
            Action::Ack => AckKind::Ack,
            Action::Retry { delay } => AckKind::Nak(Some(delay)),
            Action::DeadLetter { reason } => match self.dead_letter(&delivery, &reason).await {
                Ok(()) => AckKind::Term,
                Err(e) => {
                    tracing::warn!(error = %e, "dead letter not published; retrying");
                    Counters::bump(&self.counters.settle_errors);
                    AckKind::Nak(Some(self.config.retry_delay))
                }
            },
        };
        if let Err(e) = message.ack_with(kind).await {
            // Not settled: JetStream redelivers after `ack_wait`.
            tracing::warn!(error = %e, "could not settle a message");
            Counters::bump(&self.counters.settle_errors);
        }
    }

    async fn dead_letter(&self, d: &Delivery, reason: &str) -> Result<(), dedup_core::BoxError> {
        let id = d.message_id.as_deref().map(|id| (MSG_ID_HEADER, id));
        let map = headers(
            d.headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .chain(id)
                .chain([(DEAD_LETTER_REASON, reason)]),
        )?;
        send(&self.js, &self.dead_letter_subject, map, d.payload.clone())
            .await?
            .await?;
        Ok(())
    }
}

fn delivery(message: &Message) -> Delivery {
    let headers = message.message.headers.as_ref();
    let info = message.info().ok();
    Delivery {
        message_id: headers
            .and_then(|h| h.get(MSG_ID_HEADER))
            .map(|v| v.as_str().to_owned()),
        payload: message.message.payload.clone(),
        headers: headers
            .map(|h| {
                h.iter()
                    .filter(|(name, _)| AsRef::<str>::as_ref(*name) != MSG_ID_HEADER)
                    .flat_map(|(name, values)| {
                        values
                            .iter()
                            .map(move |v| (name.to_string(), v.as_str().to_owned()))
                    })
                    .collect()
            })
            .unwrap_or_default(),
        published_at: info.as_ref().map(|i| SystemTime::from(i.published)),
        redelivered: info.as_ref().is_some_and(|i| i.delivered > 1),
        broker_ref: info
            .map(|i| i.stream_sequence.to_string())
            .unwrap_or_default(),
    }
}
