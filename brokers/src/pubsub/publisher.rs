//! [`PubSubPublisher`]: outbox rows to Pub/Sub topics, `Ok` only on the server's answer.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::BoxError;
use dedup_core::outbox::{OutboxRow, Publisher};
use gcloud_googleapis::pubsub::v1::PubsubMessage;
use gcloud_pubsub::client::Client;
use gcloud_pubsub::publisher::Publisher as TopicPublisher;

use super::MESSAGE_ID_ATTRIBUTE;
use crate::PublishTimedOut;

/// [`PubSubPublisher::publish_timeout`] unless set.
const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// At most this many messages go in one publish request (Pub/Sub takes 1 000).
const MAX_BATCH: usize = 1000;

/// Publishes outbox rows to Pub/Sub topics (the row's destination: a topic id of the
/// client's project) with one `Publish` call per row (or per run of rows to one topic in
/// [`publish_all`](Publisher::publish_all)): `Ok` only once the server answered with the
/// message ids, which it does after storing the messages. The row's `message_id` becomes
/// the [`MESSAGE_ID_ATTRIBUTE`] attribute, its headers attributes, its `ordering_key` the
/// message's ordering key (kept in order only on a subscription with message ordering on).
///
/// A call answers within [`publish_timeout`](Self::publish_timeout), 10 s by default, the
/// client's own retries included (the request is cancelled then): its
/// [`delivery_timeout`](Publisher::delivery_timeout), which a relay checks against its hold.
///
/// # Errors
///
/// A publish answers `Err` whenever the broker did not confirm: the message may or may not
/// be there. The relay then publishes it again later, with the same message id, and the
/// consumer's inbox drops the copy.
///
/// # Cancel safety
///
/// A dropped publish may still reach the broker: the server may have stored it. The relay counts its rows as not
/// published, and publishes them again.
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
/// use dedup_core::outbox::{OutboxStore, Relay};
///
/// # async fn example(outbox: Arc<dyn OutboxStore>) -> Result<(), dedup_core::BoxError> {
/// use dedup_brokers::pubsub::gcloud_pubsub::client::{Client, ClientConfig};
///
/// // `PUBSUB_EMULATOR_HOST`, when set, names the emulator.
/// let client = Client::new(ClientConfig::default().with_auth().await?).await?;
/// let publisher = dedup_brokers::pubsub::PubSubPublisher::new(client);
/// let relay = Relay::new(outbox, Arc::new(publisher)).start()?;
/// // ... on shutdown:
/// relay.stop().await;
/// # Ok(())
/// # }
/// ```
pub struct PubSubPublisher {
    client: Client,
    topics: Mutex<HashMap<String, TopicPublisher>>,
    publish_timeout: Duration,
}

impl std::fmt::Debug for PubSubPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PubSubPublisher").finish_non_exhaustive()
    }
}

impl PubSubPublisher {
    /// A publisher through `client` (gcloud-pubsub's; its project owns the topics).
    pub fn new(client: Client) -> Self {
        PubSubPublisher {
            client,
            topics: Mutex::new(HashMap::new()),
            publish_timeout: DEFAULT_PUBLISH_TIMEOUT,
        }
    }

    /// How long a call may wait for the server's answers in all before its rows count as
    /// failed (10 s by default).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// `send`'s answer, or [`PublishTimedOut`] at `deadline`.
    async fn send_by(
        &self,
        destination: &str,
        rows: &[&OutboxRow],
        deadline: tokio::time::Instant,
    ) -> Result<(), BoxError> {
        let timed_out = PublishTimedOut {
            publisher: "pubsub",
            destination: destination.to_owned(),
            timeout: self.publish_timeout,
        };
        let send = async { Ok(self.send(destination, rows).await?) };
        timed_out.unless(deadline, send).await
    }

    fn topic(&self, id: &str) -> TopicPublisher {
        let mut topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        topics
            .entry(id.to_owned())
            .or_insert_with(|| self.client.topic(id).new_publisher(None))
            .clone()
    }

    async fn send(&self, destination: &str, rows: &[&OutboxRow]) -> Result<(), Unconfirmed> {
        let messages = rows.iter().map(|row| message(row)).collect();
        let ids = self
            .topic(destination)
            .publish_immediately(messages, None)
            .await
            .map_err(|e| Unconfirmed::Refused {
                destination: destination.to_owned(),
                source: e,
            })?;
        if ids.len() != rows.len() {
            return Err(Unconfirmed::Short {
                destination: destination.to_owned(),
                ids: ids.len(),
                sent: rows.len(),
            });
        }
        Ok(())
    }
}

fn message(row: &OutboxRow) -> PubsubMessage {
    let mut attributes: HashMap<String, String> = row
        .headers
        .iter()
        .filter(|(n, _)| n != MESSAGE_ID_ATTRIBUTE)
        .cloned()
        .collect();
    attributes.insert(MESSAGE_ID_ATTRIBUTE.to_owned(), row.message_id.clone());
    PubsubMessage {
        data: row.payload.clone().into(),
        attributes,
        ordering_key: row.ordering_key.clone().unwrap_or_default(),
        ..PubsubMessage::default()
    }
}

/// A publish the server did not confirm (cloned to every row of a failed request).
#[derive(Clone, Debug, thiserror::Error)]
enum Unconfirmed {
    /// The call failed.
    #[error("Pub/Sub did not confirm the publish to {destination}")]
    Refused {
        destination: String,
        #[source]
        source: gcloud_gax::grpc::Status,
    },
    /// The server answered with fewer message ids than messages sent.
    #[error("Pub/Sub answered {ids} message ids for {sent} messages to {destination}")]
    Short {
        destination: String,
        ids: usize,
        sent: usize,
    },
}

/// `error` (from [`PubSubPublisher::send_by`]) for another row of its request.
fn copy(error: &BoxError) -> BoxError {
    if let Some(e) = error.downcast_ref::<Unconfirmed>() {
        Box::new(e.clone())
    } else if let Some(e) = error.downcast_ref::<PublishTimedOut>() {
        Box::new(e.clone())
    } else {
        error.to_string().into()
    }
}

#[async_trait]
impl Publisher for PubSubPublisher {
    fn name(&self) -> &'static str {
        "pubsub"
    }

    /// [`publish_timeout`](Self::publish_timeout).
    fn delivery_timeout(&self) -> Duration {
        self.publish_timeout
    }

    async fn publish(&self, row: &OutboxRow) -> Result<(), BoxError> {
        let deadline = tokio::time::Instant::now() + self.publish_timeout;
        self.send_by(&row.destination, &[row], deadline).await
    }

    /// Rows to one topic in a row go in one request (at most 1 000 each); each row gets its
    /// request's result. The requests share one publish timeout.
    async fn publish_all(&self, rows: &[OutboxRow]) -> Vec<Result<(), BoxError>> {
        let deadline = tokio::time::Instant::now() + self.publish_timeout;
        let mut results = Vec::with_capacity(rows.len());
        let mut start = 0;
        while start < rows.len() {
            let destination = &rows[start].destination;
            let end = rows[start..]
                .iter()
                .take(MAX_BATCH)
                .position(|r| &r.destination != destination)
                .map_or((start + MAX_BATCH).min(rows.len()), |n| start + n);
            let batch: Vec<&OutboxRow> = rows[start..end].iter().collect();
            let result = self.send_by(destination, &batch, deadline).await;
            results.extend((start..end).map(|_| match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(copy(e)),
            }));
            start = end;
        }
        results
    }
}
