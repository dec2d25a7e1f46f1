//! [`RabbitConsumer`]: a queue's deliveries through a [`Handle`](crate::Handle), with manual acks.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, Consumer};

use super::Topology;
use super::errors::classify;
use super::pending::{DeadLetters, RabbitPending, requeue};
use super::topology::check_dead_letter_exchange;
use crate::consumer::consumer_plumbing;
use crate::{BrokerError, ConsumerConfig, Health, Shutdown, Source};

/// How the consumer gets its channel.
enum Link {
    /// The caller's channel: used once; a lost channel ends `run` (no way to open another).
    Channel(Channel),
    /// A connection of its own, opened (again) from a URI.
    Uri {
        uri: String,
        properties: ConnectionProperties,
    },
}

/// Consumes a RabbitMQ queue with manual acks.
///
/// - Key: each delivery's AMQP `message_id`. The consumer name is the queue's by default.
/// - Prefetch: [`ConsumerConfig::in_flight`].
/// - Ack: `basic.ack`.
/// - Retry: a `basic.nack` with requeue, sent after the delay. AMQP has no delayed
///   requeue, so the delivery keeps its in-flight slot while it waits. A shutdown ends
///   the wait at once.
/// - Dead letter: per [`DeadLetters`].
///
/// Built with [`from_uri`](Self::from_uri), it owns its connection. After a lost
/// connection or a broker restart, it connects and subscribes again, with the backoff of
/// [`ConsumerConfig::reconnect_delay`]. Built with [`new`](Self::new) over a channel, it
/// cannot open another: a lost channel ends `run` with an error.
///
/// Topology: [`declare`](Self::declare) declares the queue, its dead-letter exchange and
/// its dead-letter queue at every connect. Without it, a `from_uri` consumer that rejects
/// ([`DeadLetters::QueueDlx`]) checks at every connect that the queue has an
/// `x-dead-letter-exchange`. It refuses to run without one
/// ([`BrokerError::MissingTopology`]).
///
/// # Examples
///
/// ```no_run
/// use dedup_brokers::rabbitmq::{RabbitConsumer, Topology};
/// use dedup_brokers::{ConsumerConfig, shutdown, with_inbox};
/// use dedup_core::{BoxError, Inbox, MemoryStore};
///
/// # async fn example() -> Result<(), BoxError> {
/// let inbox = Inbox::new(MemoryStore::new()); // your store
/// let handler = with_inbox(inbox, |lease, delivery| async move {
///     println!("charging {} bytes, key {}", delivery.payload.len(), lease.idempotency_key());
///     Ok::<_, BoxError>(None)
/// });
///
/// let consumer = RabbitConsumer::from_uri("amqp://127.0.0.1:5672", "orders", ConsumerConfig::default())
///     .declare(Topology::for_queue("orders"));
/// let (stop, signal) = shutdown();
/// let running = tokio::spawn(consumer.run(handler, signal));
/// // ... later, on SIGTERM:
/// stop.shut_down();
/// let stats = running.await??;
/// println!("{stats:?}");
/// # Ok(())
/// # }
/// ```
pub struct RabbitConsumer {
    link: Link,
    queue: String,
    config: ConsumerConfig,
    health: Health,
    dead_letters: Arc<DeadLetters>,
    topology: Option<Topology>,
    dlx_by_policy: bool,
    connection: Option<Connection>,
    channel: Option<Channel>,
    consumer: Option<Consumer>,
    failed: Option<lapin::Error>,
    cancelled: bool,
}

consumer_plumbing!(
    RabbitConsumer,
    debug: [queue, dead_letters],
    on_shutdown: "stops consuming and lets started handlers finish and settle. It requeues \
         what was prefetched but not started.",
    errors: [
        "[`BrokerError::Config`]: an invalid [`ConsumerConfig`] (or `in_flight` above \
         65535). Nothing was consumed.",
        "[`BrokerError::Refused`]: refused credentials or access, a missing queue, a \
         declared queue that exists with other arguments. Also a lost channel of a \
         consumer made with [`new`](Self::new).",
        "[`BrokerError::MissingTopology`]: the queue has no `x-dead-letter-exchange` for \
         [`DeadLetters::QueueDlx`].",
    ],
    redelivery: ".",
);

impl RabbitConsumer {
    /// A consumer of `queue` on `channel`.
    ///
    /// It sets `basic.qos` on the channel. It cannot reconnect: prefer
    /// [`from_uri`](Self::from_uri) for a service. Nothing is contacted until
    /// [`run`](Self::run).
    pub fn new(channel: Channel, queue: impl Into<String>, config: ConsumerConfig) -> Self {
        Self::with_link(Link::Channel(channel), queue.into(), config)
    }

    /// A consumer of `queue` on a connection of its own to `uri`.
    ///
    /// [`run`](Self::run) opens the connection, and opens it again after it is lost. It
    /// uses lapin's default connection properties. See the [type's docs](Self) for an
    /// example.
    pub fn from_uri(
        uri: impl Into<String>,
        queue: impl Into<String>,
        config: ConsumerConfig,
    ) -> Self {
        let link = Link::Uri {
            uri: uri.into(),
            properties: ConnectionProperties::default(),
        };
        Self::with_link(link, queue.into(), config)
    }

    fn with_link(link: Link, queue: String, config: ConsumerConfig) -> Self {
        RabbitConsumer {
            link,
            queue,
            config,
            health: Health::default(),
            dead_letters: Arc::default(),
            topology: None,
            dlx_by_policy: false,
            connection: None,
            channel: None,
            consumer: None,
            failed: None,
            cancelled: false,
        }
    }

    /// The connection properties of a consumer made by [`from_uri`](Self::from_uri)
    /// (ignored for one made over a channel).
    pub fn connection_properties(mut self, props: ConnectionProperties) -> Self {
        if let Link::Uri { properties, .. } = &mut self.link {
            *properties = props;
        }
        self
    }

    /// Where dead letters go (default: the queue's dead-letter exchange).
    pub fn dead_letters(mut self, dead_letters: DeadLetters) -> Self {
        self.dead_letters = Arc::new(dead_letters);
        self
    }

    /// Declare `topology` (the queue, its dead-letter exchange and queue) at every connect,
    /// before consuming. Its queue must be this consumer's; a queue that exists with other
    /// arguments ends `run` with [`BrokerError::Refused`].
    pub fn declare(mut self, topology: Topology) -> Self {
        self.topology = Some(topology);
        self
    }

    /// The queue's dead-letter exchange is set by a RabbitMQ policy, which AMQP cannot
    /// read: skip the start-up check of [`DeadLetters::QueueDlx`] for a queue without an
    /// `x-dead-letter-exchange` argument.
    pub fn dead_letter_exchange_by_policy(mut self) -> Self {
        self.dlx_by_policy = true;
        self
    }

    /// A lost channel: retryable when this consumer can open another, final when it was
    /// made over the caller's channel.
    fn lost(&self, error: BrokerError) -> BrokerError {
        match (&self.link, error) {
            (Link::Channel(_), BrokerError::Broker { context, source }) => BrokerError::Refused {
                context: format!(
                    "{context} (a consumer made over a channel, RabbitConsumer::new, cannot \
                     open another; RabbitConsumer::from_uri can)"
                ),
                source,
            },
            (_, error) => error,
        }
    }

    async fn open_channel(&mut self) -> Result<Channel, BrokerError> {
        match &self.link {
            Link::Channel(channel) => {
                if self.channel.is_some() || !channel.status().connected() {
                    return Err(BrokerError::refused(
                        format!("consuming {}", self.queue),
                        "the channel is closed; a consumer made over a channel \
                         (RabbitConsumer::new) cannot open another (RabbitConsumer::from_uri can)",
                    ));
                }
                Ok(channel.clone())
            }
            Link::Uri { uri, properties } => {
                if let Some(old) = self.connection.take() {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(1),
                        old.close(0, "reconnecting".into()),
                    )
                    .await;
                }
                let connection = super::errors::connect(uri, properties.clone())
                    .await
                    .map_err(|e| classify("connecting to RabbitMQ", e))?;
                let channel = connection
                    .create_channel()
                    .await
                    .map_err(|e| classify("opening a channel", e))?;
                self.connection = Some(connection);
                Ok(channel)
            }
        }
    }
}

#[async_trait]
impl Source for RabbitConsumer {
    type Pending = RabbitPending;

    fn endpoint(&self) -> &str {
        &self.queue
    }

    fn check(&self, config: &ConsumerConfig) -> Result<(), BrokerError> {
        if let Some(topology) = self.topology.as_ref().filter(|t| t.queue != self.queue) {
            return Err(BrokerError::Config(format!(
                "the topology declares queue {}, the consumer consumes {}",
                topology.queue, self.queue
            )));
        }
        u16::try_from(config.in_flight)
            .map(drop)
            .map_err(|_| BrokerError::Config("in_flight above 65535 (AMQP prefetch)".into()))
    }

    async fn connect(&mut self, config: &ConsumerConfig) -> Result<(), BrokerError> {
        self.consumer = None;
        self.failed = None;
        let channel = self.open_channel().await?;
        self.channel = Some(channel.clone());
        if let Some(topology) = &self.topology {
            topology.declare(&channel).await?;
        } else if let (DeadLetters::QueueDlx, false, Some(connection)) =
            (&*self.dead_letters, self.dlx_by_policy, &self.connection)
        {
            check_dead_letter_exchange(connection, &self.queue).await?;
        }
        let prefetch = u16::try_from(config.in_flight).unwrap_or(u16::MAX);
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| classify("basic.qos", e))?;
        let consumer = channel
            .basic_consume(
                self.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| classify(format!("basic.consume on {}", self.queue), e))?;
        self.consumer = Some(consumer);
        Ok(())
    }

    async fn fetch(
        &mut self,
        max: usize,
        shutdown: &Shutdown,
    ) -> Result<Vec<RabbitPending>, BrokerError> {
        if let Some(e) = self.failed.take() {
            return Err(self.lost(classify("consuming", e)));
        }
        let Some(consumer) = self.consumer.as_mut() else {
            return Err(BrokerError::broker("consuming", "not subscribed"));
        };
        let first = tokio::select! {
            biased;
            _ = shutdown.wait() => return Ok(Vec::new()),
            next = consumer.next() => next,
        };
        let mut fetched = Vec::new();
        match first {
            Some(Ok(d)) => fetched.push(self.pending(d)),
            Some(Err(e)) => return Err(self.lost(classify("consuming", e))),
            None => {
                return Err(self.lost(BrokerError::broker(
                    "consuming",
                    format!("the consumer of {} was closed", self.queue),
                )));
            }
        }
        // Whatever else the broker already sent, up to `max`, without waiting.
        while fetched.len() < max {
            let Some(consumer) = self.consumer.as_mut() else {
                break;
            };
            match consumer.next().now_or_never() {
                Some(Some(Ok(d))) => fetched.push(self.pending(d)),
                Some(Some(Err(e))) => {
                    self.failed = Some(e);
                    break;
                }
                Some(None) | None => break,
            }
        }
        Ok(fetched)
    }

    async fn stop(&mut self) {
        if let (Some(channel), Some(consumer)) = (&self.channel, &self.consumer) {
            self.cancelled = channel
                .basic_cancel(consumer.tag(), BasicCancelOptions::default())
                .await
                .is_ok();
        }
    }

    async fn give_back(&mut self) {
        let Some(consumer) = self.consumer.as_mut().filter(|_| self.cancelled) else {
            return;
        };
        // The stream ends after the cancel; whatever is not nacked in time is requeued by
        // the broker when the channel closes.
        let requeue_all = async {
            while let Some(Ok(d)) = consumer.next().await {
                let _ = d.acker.nack(requeue()).await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), requeue_all).await;
    }
}

impl RabbitConsumer {
    fn pending(&self, amqp: AmqpDelivery) -> RabbitPending {
        RabbitPending::new(
            amqp,
            Arc::clone(&self.dead_letters),
            self.config.retry_delay,
        )
    }
}
