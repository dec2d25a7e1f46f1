//! [`PubSubDeadLetters`]: the copies a subscription of a dead-letter topic holds, read back
//! for a replay.

use std::collections::{BTreeMap, HashMap, HashSet};

use async_trait::async_trait;
use gcloud_gax::grpc::Code;
use gcloud_googleapis::pubsub::v1::{
    AcknowledgeRequest, ModifyAckDeadlineRequest, PubsubMessage, PullRequest, ReceivedMessage,
};
use gcloud_pubsub::apiv1::subscriber_client::SubscriberClient;
use gcloud_pubsub::client::{Client, ClientConfig};
use gcloud_pubsub::publisher::Publisher;

use super::errors::classify;
use super::{MESSAGE_ID_ATTRIBUTE, ORIGIN_ATTRIBUTE};
use crate::BrokerError;
use crate::replay::{DeadLetter, DeadLetters};

/// The dead letters of a [`PubSubConsumer`](super::PubSubConsumer): what a subscription of
/// its dead-letter topic holds.
///
/// - Take: unary pulls that do not wait on the server. A copy taken is held until its ack
///   deadline (the subscription's). A copy that comes back within the session (its
///   deadline passed) is not taken twice.
/// - Origin: the copy's [`ORIGIN_ATTRIBUTE`] names the subscription the consumer read it
///   from; the origin is that subscription's topic, looked up once per subscription. A
///   copy whose subscription was deleted has no origin, and cannot be replayed.
/// - Republish: to the origin topic, with the payload, the attributes (the message id
///   among them) less the failure attributes, the reason and [`ORIGIN_ATTRIBUTE`], and
///   the ordering key (kept as the letter's key). The server's answer is the confirm.
/// - Settle: acknowledge the copy.
/// - Give back: an ack deadline of zero for every copy held, so it comes again at once.
pub struct PubSubDeadLetters {
    client: Client,
    subscriber: SubscriberClient,
    /// The subscription's full name (`projects/P/subscriptions/S`).
    subscription: String,
    /// The ack ids of the copies held, by Pub/Sub message id (a copy's place).
    held: BTreeMap<String, String>,
    /// The copies settled in this session, by Pub/Sub message id.
    settled: HashSet<String>,
    /// The topic of each origin subscription looked up (`None`: it no longer exists).
    topics: HashMap<String, Option<String>>,
    /// A publisher per origin topic republished to.
    publishers: HashMap<String, Publisher>,
}

impl std::fmt::Debug for PubSubDeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PubSubDeadLetters")
            .field("subscription", &self.subscription)
            .field("held", &self.held.len())
            .finish_non_exhaustive()
    }
}

impl PubSubDeadLetters {
    /// The dead letters in `subscription` (an id in the client's project, or a full name),
    /// a subscription of the dead-letter topic.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Refused`] when the subscription does not exist or access is refused;
    /// [`BrokerError::Broker`] when the server does not answer.
    pub async fn new(client: Client, subscription: &str) -> Result<Self, BrokerError> {
        let found = client.subscription(subscription);
        let name = found.fully_qualified_name().to_owned();
        found
            .config(None)
            .await
            .map_err(|e| classify(format!("looking up subscription {name}"), e))?;
        Ok(PubSubDeadLetters {
            subscriber: found.get_client(),
            client,
            subscription: name,
            held: BTreeMap::new(),
            settled: HashSet::new(),
            topics: HashMap::new(),
            publishers: HashMap::new(),
        })
    }

    /// Opens `url`: `pubsub://PROJECT?subscription=S`. The client talks to the emulator
    /// `PUBSUB_EMULATOR_HOST` names when that is set, else to Google Cloud with the
    /// default credentials.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Config`] for a URL without the project or the subscription, or
    /// without credentials; as [`new`](Self::new).
    pub async fn open(url: &str) -> Result<Self, BrokerError> {
        let (url, subscription) = crate::replay::url_param(url, "subscription")?;
        let project = url
            .strip_prefix("pubsub://")
            .map(|p| p.trim_end_matches('/'))
            .filter(|p| !p.is_empty() && !p.contains(['/', '?']))
            .ok_or_else(|| {
                BrokerError::Config("a Pub/Sub URL is pubsub://PROJECT?subscription=S".into())
            })?;
        let config = ClientConfig {
            project_id: Some(project.to_owned()),
            ..ClientConfig::default()
        };
        // Google's token source builds a reqwest client, which panics without a process
        // default rustls provider: ring, the one compiled in, unless one is set already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = config
            .with_auth()
            .await
            .map_err(|e| BrokerError::Config(format!("Google Cloud credentials: {e}")))?;
        let client = Client::new(config)
            .await
            .map_err(|e| BrokerError::broker("connecting to Pub/Sub for the dead letters", e))?;
        Self::new(client, &subscription).await
    }

    /// The topic of the subscription named by a copy's [`ORIGIN_ATTRIBUTE`]
    /// (`subscription/message id`), looked up once.
    async fn origin(&mut self, attribute: Option<&str>) -> Result<String, BrokerError> {
        let Some((subscription, _)) = attribute.and_then(|a| a.rsplit_once('/')) else {
            return Ok(String::new());
        };
        if let Some(topic) = self.topics.get(subscription) {
            return Ok(topic.clone().unwrap_or_default());
        }
        let topic = match self.client.subscription(subscription).config(None).await {
            Ok((topic, _)) => Some(topic),
            Err(e) if e.code() == Code::NotFound => None,
            Err(e) => {
                return Err(classify(
                    format!("looking up subscription {subscription}"),
                    e,
                ));
            }
        };
        self.topics.insert(subscription.to_owned(), topic.clone());
        Ok(topic.unwrap_or_default())
    }

    /// `received` as a letter, or `None` for a copy this session took or settled already
    /// (its deadline passed): its newest ack id is kept.
    async fn letter(
        &mut self,
        received: ReceivedMessage,
    ) -> Result<Option<DeadLetter>, BrokerError> {
        let Some(message) = received.message else {
            return Ok(None);
        };
        let place = message.message_id.clone();
        if let Some(ack_id) = self.held.get_mut(&place) {
            *ack_id = received.ack_id;
            return Ok(None);
        }
        if self.settled.contains(&place) {
            self.ack(&place, received.ack_id).await?;
            return Ok(None);
        }
        let mut headers: Vec<(String, String)> = message.attributes.into_iter().collect();
        headers.sort();
        let attribute = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        let message_id = attribute(MESSAGE_ID_ATTRIBUTE);
        let origin = self.origin(attribute(ORIGIN_ATTRIBUTE).as_deref()).await?;
        self.held.insert(place.clone(), received.ack_id);
        let key = Some(message.ordering_key)
            .filter(|k| !k.is_empty())
            .map(bytes::Bytes::from);
        Ok(Some(DeadLetter {
            message_id,
            headers,
            payload: message.data,
            origin,
            key,
            place,
        }))
    }

    async fn ack(&self, place: &str, ack_id: String) -> Result<(), BrokerError> {
        let request = AcknowledgeRequest {
            subscription: self.subscription.clone(),
            ack_ids: vec![ack_id],
        };
        self.subscriber
            .acknowledge(request, None)
            .await
            .map(drop)
            .map_err(|e| classify(format!("acknowledging {place} on {}", self.subscription), e))
    }
}

#[async_trait]
impl DeadLetters for PubSubDeadLetters {
    fn describe(&self) -> String {
        format!("Pub/Sub subscription {:?}", self.subscription)
    }

    async fn take(&mut self, limit: usize) -> Result<Vec<DeadLetter>, BrokerError> {
        let mut taken = Vec::new();
        while taken.len() < limit {
            #[allow(deprecated)] // return_immediately: a pull that never waits on the server
            let request = PullRequest {
                subscription: self.subscription.clone(),
                return_immediately: true,
                max_messages: i32::try_from(limit - taken.len()).unwrap_or(i32::MAX),
            };
            let received = self
                .subscriber
                .pull(request, None)
                .await
                .map_err(|e| classify(format!("pulling from {}", self.subscription), e))?
                .into_inner()
                .received_messages;
            let before = taken.len();
            for r in received {
                taken.extend(self.letter(r).await?);
            }
            if taken.len() == before {
                break;
            }
        }
        Ok(taken)
    }

    async fn republish(&mut self, letter: &DeadLetter) -> Result<(), BrokerError> {
        let id = letter.message_id.as_deref().ok_or_else(|| {
            BrokerError::Config(format!("the copy {} has no message id", letter.place))
        })?;
        if letter.origin.is_empty() {
            return Err(BrokerError::Config(format!(
                "the copy of {id} names no subscription that still exists ({ORIGIN_ATTRIBUTE})"
            )));
        }
        let mut attributes: HashMap<String, String> = letter
            .replay_headers()
            .into_iter()
            .filter(|(n, _)| n != ORIGIN_ATTRIBUTE)
            .collect();
        attributes.insert(MESSAGE_ID_ATTRIBUTE.to_owned(), id.to_owned());
        let ordering_key = letter
            .key
            .as_ref()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .unwrap_or_default();
        let message = PubsubMessage {
            data: letter.payload.clone(),
            attributes,
            ordering_key,
            ..PubsubMessage::default()
        };
        let client = &self.client;
        self.publishers
            .entry(letter.origin.clone())
            .or_insert_with(|| client.topic(&letter.origin).new_publisher(None))
            .publish_immediately(vec![message], None)
            .await
            .map(drop)
            .map_err(|e| classify(format!("republishing {id} to {}", letter.origin), e))
    }

    async fn settle(&mut self, letter: &DeadLetter) -> Result<(), BrokerError> {
        let ack_id = self.held.remove(&letter.place).ok_or_else(|| {
            BrokerError::Config(format!(
                "copy {} of {} was not taken in this session, or is settled",
                letter.place, self.subscription
            ))
        })?;
        self.ack(&letter.place, ack_id).await?;
        self.settled.insert(letter.place.clone());
        Ok(())
    }

    async fn give_back(&mut self) -> Result<(), BrokerError> {
        let held = std::mem::take(&mut self.held);
        if held.is_empty() {
            return Ok(());
        }
        let request = ModifyAckDeadlineRequest {
            subscription: self.subscription.clone(),
            ack_ids: held.into_values().collect(),
            ack_deadline_seconds: 0,
        };
        self.subscriber
            .modify_ack_deadline(request, None)
            .await
            .map(drop)
            .map_err(|e| classify(format!("giving copies back to {}", self.subscription), e))
    }
}
