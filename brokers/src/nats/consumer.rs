//! [`NatsConsumer`]: a durable pull consumer's messages through a [`Handle`](crate::Handle).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::{AckKind, Context};
use async_trait::async_trait;
use futures::{FutureExt, StreamExt};

use super::errors::{consumer_lookup, stream_lookup};
use super::pending::NatsPending;
use crate::consumer::consumer_plumbing;
use crate::{BrokerError, ConsumerConfig, Health, Shutdown, Source};

/// Consumes a NATS JetStream stream through a durable pull consumer.
///
/// The durable consumer is created if missing, with explicit acks and `max_ack_pending`
/// = [`ConsumerConfig::in_flight`].
/// - Key: the `Nats-Msg-Id` header. The consumer name is the durable name by default.
/// - Broker timestamp: the time the stream stored the message.
/// - Ack: `Ack`.
/// - Retry: `Nak(delay)`.
/// - Dead letter: a copy is published to the dead-letter subject, with the headers, the
///   payload and the reason in [`DEAD_LETTER_REASON`](crate::DEAD_LETTER_REASON). A stream
///   must capture that subject. Once the stream acknowledged the copy, the original is
///   `Term`inated. If the publish fails, the original is `Nak`ed for a retry.
///
/// A pull request asks for the free in-flight slots. It expires after 200 ms and stays
/// open across rounds. Each round hands out the messages that arrived, waiting for the
/// first. So a message starts as soon as it arrives, and its ack lets the server send the
/// next one. At shutdown, messages of the open request that arrive after the last round
/// are given back (`Nak`, redelivered at once).
///
/// async-nats's client reconnects by itself. After a failed fetch the receive loop looks
/// up the stream and the durable consumer again. It creates the consumer if the server
/// lost it.
///
/// # Examples
///
/// ```no_run
/// use dedup_brokers::nats::NatsConsumer;
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
/// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
/// let js = async_nats::jetstream::new(client);
/// let consumer = NatsConsumer::new(js, "ORDERS", "billing", ConsumerConfig::default());
/// let (stop, signal) = shutdown();
/// let running = tokio::spawn(consumer.run(handler, signal));
/// // ... later, on SIGTERM:
/// stop.shut_down();
/// running.await??;
/// # Ok(())
/// # }
/// ```
pub struct NatsConsumer {
    js: Context,
    stream: String,
    durable: String,
    config: ConsumerConfig,
    health: Health,
    dead_letter_subject: Arc<str>,
    ack_wait: Duration,
    consumer: Option<PullConsumer>,
    /// The pull request whose messages are still arriving.
    open: Option<OpenPull>,
}

consumer_plumbing!(
    NatsConsumer,
    debug: [stream, durable, dead_letter_subject, ack_wait],
    on_shutdown: "stops fetching and lets started handlers finish and settle.",
    errors: [
        "[`BrokerError::Config`]: an invalid [`ConsumerConfig`]. Nothing was consumed.",
        "[`BrokerError::Refused`]: a stream that does not exist, refused credentials or \
         permissions.",
    ],
    redelivery: ", after its `ack_wait`.",
);

/// An open pull request's messages.
struct OpenPull(pull::Batch);

impl std::fmt::Debug for OpenPull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpenPull")
    }
}

impl NatsConsumer {
    /// A consumer of `stream` through the durable consumer `durable`.
    ///
    /// Dead letters go to `<stream>.dead`, unless
    /// [`dead_letter_subject`](Self::dead_letter_subject) says otherwise. `ack_wait` is
    /// 30 s. Nothing is contacted until [`run`](Self::run).
    pub fn new(
        js: Context,
        stream: impl Into<String>,
        durable: impl Into<String>,
        config: ConsumerConfig,
    ) -> Self {
        let stream = stream.into();
        NatsConsumer {
            js,
            dead_letter_subject: format!("{stream}.dead").into(),
            stream,
            durable: durable.into(),
            config,
            health: Health::default(),
            ack_wait: Duration::from_secs(30),
            consumer: None,
            open: None,
        }
    }

    /// Where dead letters are published.
    pub fn dead_letter_subject(mut self, subject: impl Into<String>) -> Self {
        self.dead_letter_subject = subject.into().into();
        self
    }

    /// How long JetStream waits for an ack before redelivering (when it creates the
    /// durable consumer): longer than a handler runs.
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait;
        self
    }
}

#[async_trait]
impl Source for NatsConsumer {
    type Pending = NatsPending;

    fn endpoint(&self) -> &str {
        &self.durable
    }

    async fn connect(&mut self, config: &ConsumerConfig) -> Result<(), BrokerError> {
        self.consumer = None;
        self.open = None;
        let context = format!("stream {}", self.stream);
        let stream = self
            .js
            .get_stream(&self.stream)
            .await
            .map_err(|e| stream_lookup(context, e))?;
        let consumer: PullConsumer = stream
            .get_or_create_consumer(
                &self.durable,
                pull::Config {
                    durable_name: Some(self.durable.clone()),
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: self.ack_wait,
                    max_ack_pending: config.in_flight as i64,
                    ..pull::Config::default()
                },
            )
            .await
            .map_err(|e| consumer_lookup(format!("durable consumer {}", self.durable), e))?;
        self.consumer = Some(consumer);
        Ok(())
    }

    /// The messages of the open pull request that arrived, at most `max`: waits for the
    /// first (or the request's end, at most 200 ms), then takes only those already there.
    /// A request is opened for `max` when none is. Not cut short on shutdown: what arrives
    /// later is given back ([`give_back`](Source::give_back)).
    async fn fetch(
        &mut self,
        max: usize,
        _shutdown: &Shutdown,
    ) -> Result<Vec<NatsPending>, BrokerError> {
        let Some(consumer) = &self.consumer else {
            return Err(BrokerError::broker("fetching a batch", "not connected"));
        };
        let mut open = match self.open.take() {
            Some(open) => open,
            None => OpenPull(
                consumer
                    .batch()
                    .max_messages(max)
                    .expires(Duration::from_millis(200))
                    .messages()
                    .await
                    .map_err(|e| BrokerError::broker("fetching a batch", e))?,
            ),
        };
        let mut fetched = Vec::new();
        let mut ended = false;
        while fetched.len() < max {
            let next = if fetched.is_empty() {
                open.0.next().await
            } else {
                match open.0.next().now_or_never() {
                    Some(next) => next,
                    None => break,
                }
            };
            match next {
                Some(Ok(message)) => fetched.push(NatsPending::new(
                    message,
                    Arc::clone(&self.dead_letter_subject),
                    self.config.retry_delay,
                )),
                Some(Err(e)) => {
                    tracing::debug!(error = %dedup_core::error_chain(&*e), "pull request ended");
                    ended = true;
                    break;
                }
                None => {
                    ended = true;
                    break;
                }
            }
        }
        if !ended {
            self.open = Some(open);
        }
        Ok(fetched)
    }

    /// The open pull request's messages that arrive until it ends (at most 200 ms): `Nak`ed,
    /// so the server redelivers them at once.
    async fn give_back(&mut self) {
        let Some(mut open) = self.open.take() else {
            return;
        };
        while let Some(Ok(message)) = open.0.next().await {
            if let Err(e) = message.ack_with(AckKind::Nak(None)).await {
                tracing::debug!(error = %dedup_core::error_chain(&*e), "giving a message back");
            }
        }
    }
}
