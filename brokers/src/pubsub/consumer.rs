//! [`PubSubConsumer`]: a subscription's messages, pulled, through a [`Handle`](crate::Handle).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use gcloud_gax::retry::RetrySetting;
use gcloud_googleapis::pubsub::v1::{PullRequest, ReceivedMessage};
use gcloud_pubsub::client::Client;

use super::MESSAGE_ID_ATTRIBUTE;
use super::errors::classify;
use super::pending::{Link, PubSubPending};
use crate::consumer::consumer_plumbing;
use crate::{BrokerError, ConsumerConfig, Delivery, Health, Shutdown, Source};

/// How long to wait before pulling again after a pull that found nothing.
const IDLE_WAIT: Duration = Duration::from_millis(50);

/// Consumes a Google Cloud Pub/Sub subscription with unary pulls.
///
/// A pull asks for at most the free in-flight slots, and is answered at once. It is never
/// left waiting on the server, so nothing is taken that could not be started.
///
/// - Key: each message's [`MESSAGE_ID_ATTRIBUTE`] attribute; a message without it is
///   dead-lettered (`no message id`).
/// - Ack deadline: extended every half of the subscription's deadline while the message is
///   held and its handler runs.
/// - Retry: a delay of a second or more is the message's new ack deadline (whole seconds,
///   at most 600); a shorter one is waited by the consumer, then the deadline set to zero.
/// - Dead letter: the message is published to the dead-letter topic (payload, attributes,
///   the reason in [`DEAD_LETTER_REASON`](crate::DEAD_LETTER_REASON) and the failure
///   attributes) and acknowledged once that publish was answered. At start (and at each
///   reconnect) the consumer refuses to run when the subscription or the dead-letter topic
///   does not exist, or when the dead-letter topic has no subscription: Pub/Sub drops what
///   is published to a topic nobody subscribes to.
/// - Redelivered: Pub/Sub counts delivery attempts only on a subscription with a
///   dead-letter policy of its own. Elsewhere [`Delivery::redelivered`] stays `false`.
///
/// # Examples
///
/// ```no_run
/// use dedup_brokers::pubsub::PubSubConsumer;
/// use dedup_brokers::pubsub::gcloud_pubsub::client::{Client, ClientConfig};
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
/// // `PUBSUB_EMULATOR_HOST`, when set, names the emulator.
/// let client = Client::new(ClientConfig::default().with_auth().await?).await?;
/// let consumer = PubSubConsumer::new(client, "orders-billing", "orders-dead", ConsumerConfig::default());
/// let (stop, signal) = shutdown();
/// let running = tokio::spawn(consumer.run(handler, signal));
/// // ... later, on SIGTERM:
/// stop.shut_down();
/// running.await??;
/// # Ok(())
/// # }
/// ```
pub struct PubSubConsumer {
    client: Client,
    subscription: String,
    dead_letter_topic: String,
    config: ConsumerConfig,
    link: Option<Arc<Link>>,
    health: Health,
}

consumer_plumbing!(
    PubSubConsumer,
    debug: [subscription, dead_letter_topic],
    on_shutdown: "lets started handlers finish and settle.",
    errors: [
        "[`BrokerError::Config`]: an invalid [`ConsumerConfig`], or an empty subscription \
         or dead-letter topic name. Nothing was consumed.",
        "[`BrokerError::Refused`]: refused credentials or permissions; a subscription or \
         dead-letter topic that does not exist; a dead-letter topic without a \
         subscription (Pub/Sub would drop the copies).",
    ],
    redelivery: ", once its ack deadline passes.",
);

impl PubSubConsumer {
    /// A consumer of the subscription `subscription`, an id in the client's project.
    ///
    /// Dead letters go to the topic `dead_letter_topic`, an id too. It must exist and have
    /// a subscription. Nothing is contacted until [`run`](Self::run).
    pub fn new(
        client: Client,
        subscription: impl Into<String>,
        dead_letter_topic: impl Into<String>,
        config: ConsumerConfig,
    ) -> Self {
        PubSubConsumer {
            client,
            subscription: subscription.into(),
            dead_letter_topic: dead_letter_topic.into(),
            config,
            link: None,
            health: Health::default(),
        }
    }

    fn pending(&self, link: &Arc<Link>, received: ReceivedMessage) -> Option<PubSubPending> {
        let message = received.message?;
        let headers: Vec<(String, String)> = message.attributes.into_iter().collect();
        let message_id = headers
            .iter()
            .find(|(n, _)| n == MESSAGE_ID_ATTRIBUTE)
            .map(|(_, v)| v.clone());
        let published_at = message.publish_time.and_then(|t| {
            let secs = u64::try_from(t.seconds).ok()?;
            let nanos = u32::try_from(t.nanos).ok()?;
            Some(SystemTime::UNIX_EPOCH + Duration::new(secs, nanos))
        });
        let delivery = Delivery {
            message_id,
            payload: message.data,
            headers,
            published_at,
            redelivered: received.delivery_attempt > 1,
            broker_ref: message.message_id,
        };
        Some(PubSubPending::new(
            delivery,
            received.ack_id,
            message.ordering_key,
            Arc::clone(link),
        ))
    }
}

/// No retry inside the client: the receive loop reconnects with its own backoff.
fn no_retry() -> RetrySetting {
    RetrySetting {
        take: 0,
        codes: Vec::new(),
        ..RetrySetting::default()
    }
}

#[async_trait]
impl Source for PubSubConsumer {
    type Pending = PubSubPending;

    fn endpoint(&self) -> &str {
        &self.subscription
    }

    fn check(&self, _config: &ConsumerConfig) -> Result<(), BrokerError> {
        if self.subscription.is_empty() || self.dead_letter_topic.is_empty() {
            return Err(BrokerError::Config(
                "the subscription and the dead-letter topic must be named".into(),
            ));
        }
        Ok(())
    }

    async fn connect(&mut self, _config: &ConsumerConfig) -> Result<(), BrokerError> {
        self.link = None;
        let subscription = self.client.subscription(&self.subscription);
        let name = subscription.fully_qualified_name().to_owned();
        let (_topic, settings) = subscription
            .config(Some(no_retry()))
            .await
            .map_err(|e| classify(format!("looking up subscription {name}"), e))?;
        let dead = self.client.topic(&self.dead_letter_topic);
        let dead_name = dead.fully_qualified_name().to_owned();
        let check = format!("checking the dead-letter topic {dead_name}");
        if !dead
            .exists(Some(no_retry()))
            .await
            .map_err(|e| classify(check.clone(), e))?
        {
            return Err(BrokerError::refused(
                check,
                "the topic does not exist; create it (and a subscription to it) first",
            ));
        }
        if dead
            .subscriptions(Some(no_retry()))
            .await
            .map_err(|e| classify(check.clone(), e))?
            .is_empty()
        {
            return Err(BrokerError::refused(
                check,
                "the topic has no subscription: Pub/Sub would drop every dead letter; subscribe to it first",
            ));
        }
        self.link = Some(Arc::new(Link {
            subscriber: subscription.get_client(),
            subscription: name,
            dead_letters: dead.new_publisher(None),
            ack_deadline: settings.ack_deadline_seconds.clamp(10, 600),
        }));
        Ok(())
    }

    async fn fetch(
        &mut self,
        max: usize,
        shutdown: &Shutdown,
    ) -> Result<Vec<PubSubPending>, BrokerError> {
        let Some(link) = self.link.clone() else {
            return Err(BrokerError::broker("pulling", "not connected"));
        };
        #[allow(deprecated)] // return_immediately: a pull that never waits on the server
        let request = PullRequest {
            subscription: link.subscription.clone(),
            return_immediately: true,
            max_messages: i32::try_from(max).unwrap_or(i32::MAX),
        };
        let received = link
            .subscriber
            .pull(request, Some(no_retry()))
            .await
            .map_err(|e| classify(format!("pulling from {}", link.subscription), e))?
            .into_inner()
            .received_messages;
        if received.is_empty() {
            tokio::select! {
                biased;
                _ = shutdown.wait() => {}
                _ = tokio::time::sleep(IDLE_WAIT) => {}
            }
            return Ok(Vec::new());
        }
        Ok(received
            .into_iter()
            .filter_map(|r| self.pending(&link, r))
            .collect())
    }
}
