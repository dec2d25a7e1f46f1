//! [`PubSubPending`]: one pulled message, its ack deadline kept extended until it settles.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use gcloud_googleapis::pubsub::v1::{AcknowledgeRequest, ModifyAckDeadlineRequest, PubsubMessage};
use gcloud_pubsub::apiv1::subscriber_client::SubscriberClient;
use gcloud_pubsub::publisher::Publisher;
use tokio::task::JoinHandle;

use super::ORIGIN_ATTRIBUTE;
use super::errors::classify;
use crate::{Action, BrokerError, DEAD_LETTER_REASON, Delivery, Pending, Shutdown};

/// The longest ack deadline Pub/Sub takes (seconds).
const MAX_ACK_DEADLINE: u64 = 600;

/// What settles messages of one connected subscription.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) subscriber: SubscriberClient,
    /// The subscription's full name (`projects/P/subscriptions/S`).
    pub(crate) subscription: String,
    /// A publisher to the dead-letter topic.
    pub(crate) dead_letters: Publisher,
    /// The subscription's ack deadline (seconds), what each extension asks for again.
    pub(crate) ack_deadline: i32,
}

impl Link {
    async fn ack(&self, ack_id: &str) -> Result<(), BrokerError> {
        let request = AcknowledgeRequest {
            subscription: self.subscription.clone(),
            ack_ids: vec![ack_id.to_owned()],
        };
        self.subscriber
            .acknowledge(request, None)
            .await
            .map(drop)
            .map_err(|e| classify(format!("acknowledging on {}", self.subscription), e))
    }

    /// Ask for the message again in `seconds` (0: now).
    async fn modify(&self, ack_id: &str, seconds: i32) -> Result<(), BrokerError> {
        let request = ModifyAckDeadlineRequest {
            subscription: self.subscription.clone(),
            ack_ids: vec![ack_id.to_owned()],
            ack_deadline_seconds: seconds,
        };
        self.subscriber
            .modify_ack_deadline(request, None)
            .await
            .map(drop)
            .map_err(|e| {
                classify(
                    format!("modifying an ack deadline on {}", self.subscription),
                    e,
                )
            })
    }
}

/// Extends a message's ack deadline every half deadline until the message settles, so a
/// slow handler (or a message waiting for its turn) keeps it from going to another
/// consumer. Dropped before [`settled`](Self::settled) (the handler's task aborted, the
/// loop giving back a delivery it cannot start): the message is given back at once (ack
/// deadline zero) instead of at the deadline.
#[derive(Debug)]
struct KeepAlive {
    task: JoinHandle<()>,
    give_back: Option<(Arc<Link>, String)>,
}

impl KeepAlive {
    fn start(link: Arc<Link>, ack_id: String) -> Self {
        let deadline = u64::try_from(link.ack_deadline).unwrap_or(10).max(1);
        let every = Duration::from_millis(deadline * 1000 / 2);
        let (extend, id) = (Arc::clone(&link), ack_id.clone());
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = extend.modify(&id, extend.ack_deadline).await {
                    tracing::warn!(subscription = %extend.subscription, error = %dedup_core::error_chain(&e), "could not extend an ack deadline; the message may be delivered again");
                }
            }
        });
        KeepAlive {
            task,
            give_back: Some((link, ack_id)),
        }
    }

    /// Stop extending: the message is being settled.
    fn settled(mut self) {
        self.give_back = None;
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.task.abort();
        if let Some((link, ack_id)) = self.give_back.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                if let Err(e) = link.modify(&ack_id, 0).await {
                    tracing::warn!(subscription = %link.subscription, error = %dedup_core::error_chain(&e), "could not give back an unsettled message; it comes back at its ack deadline");
                }
            });
        }
    }
}

/// A pulled Pub/Sub message and what settles it. Until it settles, its ack deadline is
/// extended every half deadline; a pending dropped unsettled is given back at once (ack
/// deadline zero). A consumer process that dies holding messages gives nothing back: they
/// come again once their ack deadline passed (the subscription's, 10 s at least).
#[derive(Debug)]
pub struct PubSubPending {
    delivery: Delivery,
    ack_id: String,
    ordering_key: String,
    link: Arc<Link>,
    keep_alive: KeepAlive,
}

impl PubSubPending {
    pub(crate) fn new(
        delivery: Delivery,
        ack_id: String,
        ordering_key: String,
        link: Arc<Link>,
    ) -> Self {
        let keep_alive = KeepAlive::start(Arc::clone(&link), ack_id.clone());
        PubSubPending {
            delivery,
            ack_id,
            ordering_key,
            link,
            keep_alive,
        }
    }
}

#[async_trait]
impl Pending for PubSubPending {
    fn delivery(&self) -> &Delivery {
        &self.delivery
    }

    /// Ack: acknowledge. Retry: a delay of a second or more becomes the message's ack
    /// deadline (rounded up to whole seconds, at most 600 s); a shorter one is waited here
    /// (ended by `shutdown`), then the deadline is set to zero. Dead letter: the message is
    /// published to the dead-letter topic (payload, attributes, ordering key, the reason
    /// and the failure attributes, [`ORIGIN_ATTRIBUTE`]) and acknowledged once the server
    /// answered the publish.
    async fn settle(self, action: Action, shutdown: &Shutdown) -> Result<(), BrokerError> {
        let PubSubPending {
            delivery,
            ack_id,
            ordering_key,
            link,
            keep_alive,
        } = self;
        match action {
            Action::Ack => {
                keep_alive.settled();
                link.ack(&ack_id).await
            }
            Action::Retry { delay } if delay < Duration::from_secs(1) => {
                tokio::select! {
                    biased;
                    _ = shutdown.wait() => {}
                    _ = tokio::time::sleep(delay) => {}
                }
                keep_alive.settled();
                link.modify(&ack_id, 0).await
            }
            Action::Retry { delay } => {
                keep_alive.settled();
                let seconds = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
                let seconds = i32::try_from(seconds.min(MAX_ACK_DEADLINE)).unwrap_or(600);
                link.modify(&ack_id, seconds).await
            }
            Action::DeadLetter { reason, headers } => {
                let mut attributes: HashMap<String, String> =
                    delivery.headers.iter().cloned().collect();
                attributes.insert(DEAD_LETTER_REASON.to_owned(), reason);
                attributes.extend(headers);
                attributes.insert(
                    ORIGIN_ATTRIBUTE.to_owned(),
                    format!("{}/{}", link.subscription, delivery.broker_ref),
                );
                let copy = PubsubMessage {
                    data: delivery.payload.clone(),
                    attributes,
                    ordering_key,
                    ..PubsubMessage::default()
                };
                link.dead_letters
                    .publish_immediately(vec![copy], None)
                    .await
                    .map_err(|e| {
                        classify(
                            format!("publishing a dead letter from {}", link.subscription),
                            e,
                        )
                    })?;
                keep_alive.settled();
                link.ack(&ack_id).await
            }
        }
    }
}
