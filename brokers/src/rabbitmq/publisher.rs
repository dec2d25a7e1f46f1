//! [`RabbitPublisher`]: outbox rows to RabbitMQ with publisher confirms.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use dedup_core::BoxError;
use dedup_core::outbox::{OutboxRow, Publisher};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use lapin::{Confirmation, PublisherConfirm};

use super::errors::classify;
use super::split_destination;
use crate::BrokerError;

/// Publishes outbox rows to RabbitMQ on a channel of its own in confirm mode: `Ok` once the
/// broker confirmed (an unroutable message, returned by the broker, is an error: publishes
/// are `mandatory`). A publish whose confirm never came (the connection or channel was lost
/// first, or no confirm within [`confirm_timeout`](Self::confirm_timeout), 20 s by default)
/// is an error, never `Ok`: the message may or may not be at the broker, so the relay
/// publishes it again and consumers deduplicate by message id. The confirm timeout bounds a
/// whole call (a reconnect, the sends and the confirms of a batch): it is the publisher's
/// [`delivery_timeout`](Publisher::delivery_timeout), which a relay checks against its hold.
///
/// The row's `message_id` becomes the AMQP `message_id` property, its headers AMQP string
/// headers, the publish time the `timestamp` property (seconds; what the consumer's
/// admission floor reads); messages are persistent (delivery mode 2). Destination:
/// `exchange` or `exchange/routing-key` (see [the module](super)).
///
/// A publisher made with [`connect`](Self::connect) owns its connection: when a publish
/// finds its channel closed (the broker restarted, the connection was lost, the broker
/// closed the channel), it opens a new channel, on a new connection if that one is lost
/// too, retrying with a delay from 100 ms doubling up to 2 s for at most
/// [`reconnect_within`](Self::reconnect_within) (10 s by default); the publish that met
/// the loss still returns its error. One made with [`new`](Self::new) or
/// [`from_channel`](Self::from_channel) does not reconnect. Clones share the channel.
///
/// # Errors
///
/// A publish answers `Err` whenever the broker did not confirm: the message may or may not
/// be there. The relay then publishes it again later, with the same message id, and the
/// consumer's inbox drops the copy.
///
/// # Cancel safety
///
/// A dropped publish may still reach the broker. The relay counts its rows as not
/// published, and publishes them again.
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
/// use dedup_core::outbox::{OutboxStore, Relay};
///
/// # async fn example(outbox: Arc<dyn OutboxStore>) -> Result<(), dedup_core::BoxError> {
/// let publisher = dedup_brokers::rabbitmq::RabbitPublisher::connect(
///     "amqp://127.0.0.1:5672",
///     lapin::ConnectionProperties::default(),
/// )
/// .await?;
/// let relay = Relay::new(outbox, Arc::new(publisher)).start()?;
/// // ... on shutdown:
/// relay.stop().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct RabbitPublisher {
    channel: Arc<Mutex<Channel>>,
    link: Option<Arc<Link>>,
    reconnect_within: Duration,
    confirm_timeout: Duration,
}

/// [`RabbitPublisher::confirm_timeout`] unless set: within a relay's default 30 s hold, less
/// its 5 s mark margin.
const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(20);

/// What a publisher made by [`RabbitPublisher::connect`] connects again with.
struct Link {
    uri: String,
    properties: ConnectionProperties,
    /// Its connection; the lock also makes concurrent publishes reconnect once.
    connection: tokio::sync::Mutex<Connection>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URI may carry credentials.
        f.debug_struct("Link").finish_non_exhaustive()
    }
}

impl RabbitPublisher {
    /// A publisher on a new channel of `connection`, with confirms on.
    ///
    /// It does not reconnect (see the type's docs).
    ///
    /// # Errors
    ///
    /// lapin's error when the channel cannot be opened or put in confirm mode.
    pub async fn new(connection: &Connection) -> Result<Self, lapin::Error> {
        Self::from_channel(connection.create_channel().await?).await
    }

    /// A publisher on `channel`, which it puts in confirm mode.
    ///
    /// Do not share the channel with publishers that expect no confirms. It does not
    /// reconnect.
    ///
    /// # Errors
    ///
    /// lapin's error when the channel refuses confirm mode (or is closed).
    pub async fn from_channel(channel: Channel) -> Result<Self, lapin::Error> {
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(RabbitPublisher {
            channel: Arc::new(Mutex::new(channel)),
            link: None,
            reconnect_within: Duration::from_secs(10),
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
        })
    }

    /// A publisher on a connection of its own to `uri`.
    ///
    /// The connection is opened now, and again after it is lost.
    ///
    /// # Errors
    ///
    /// lapin's error when the connection or its channel cannot be opened: nothing
    /// listening, refused credentials, a refused virtual host.
    pub async fn connect(
        uri: impl Into<String>,
        properties: ConnectionProperties,
    ) -> Result<Self, lapin::Error> {
        let uri = uri.into();
        let connection = super::errors::connect(&uri, properties.clone()).await?;
        let mut publisher = Self::new(&connection).await?;
        publisher.link = Some(Arc::new(Link {
            uri,
            properties,
            connection: tokio::sync::Mutex::new(connection),
        }));
        Ok(publisher)
    }

    /// How long one publish keeps trying to open a channel (and a connection) again after
    /// they were lost, before it returns the connect error (10 s by default).
    pub fn reconnect_within(mut self, within: Duration) -> Self {
        self.reconnect_within = within;
        self
    }

    /// How long a publish may take in all, reconnect, send and the broker's confirm, before
    /// it returns an error (20 s by default; a batch of
    /// [`publish_all`](Publisher::publish_all) shares it). A relay refuses to start when
    /// it does not fit in its hold less its mark margin.
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    fn current(&self) -> Channel {
        self.channel
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The channel to publish on: the current one, or, for a publisher that owns its
    /// connection, a new one after the current one was closed.
    async fn channel(&self) -> Result<Channel, BrokerError> {
        let current = self.current();
        let Some(link) = self
            .link
            .as_deref()
            .filter(|_| !current.status().connected())
        else {
            return Ok(current);
        };
        let mut connection = link.connection.lock().await;
        // Another publish may have reconnected while this one waited for the lock.
        let current = self.current();
        if current.status().connected() {
            return Ok(current);
        }
        let deadline = Instant::now() + self.reconnect_within;
        let mut delay = Duration::from_millis(100);
        let channel = loop {
            // An attempt whose handshake stalls ends at the deadline, not never.
            let attempt = tokio::time::timeout_at(deadline.into(), reopen(link, &mut connection))
                .await
                .unwrap_or_else(|_| {
                    Err(BrokerError::broker(
                        "reconnecting the RabbitMQ publisher",
                        format!("no connection within {:?}", self.reconnect_within),
                    ))
                });
            match attempt {
                Ok(channel) => break channel,
                Err(e) => {
                    if !e.is_retryable() || Instant::now() + delay > deadline {
                        return Err(e);
                    }
                    tracing::debug!(error = %dedup_core::error_chain(&e), "RabbitMQ publisher reconnecting");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        };
        *self.channel.lock().unwrap_or_else(|e| e.into_inner()) = channel.clone();
        tracing::info!("RabbitMQ publisher connected again");
        Ok(channel)
    }

    /// Send one message; the confirm is awaited separately.
    pub(crate) async fn send(
        &self,
        destination: &str,
        message_id: &str,
        headers: impl IntoIterator<Item = (&str, &str)>,
        payload: &[u8],
    ) -> Result<PublisherConfirm, BoxError> {
        let channel = self.channel().await?;
        let (exchange, routing_key) = split_destination(destination);
        let mut table = FieldTable::default();
        for (name, value) in headers {
            table.insert(
                name.into(),
                AMQPValue::LongString(LongString::from(value.as_bytes().to_vec())),
            );
        }
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let props = BasicProperties::default()
            .with_message_id(message_id.into())
            .with_headers(table)
            .with_timestamp(now)
            .with_delivery_mode(2);
        let sent = channel.basic_publish(
            exchange.into(),
            routing_key.into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            payload,
            props,
        );
        // lapin answers once the frame is written; one queued as the connection died may
        // never be answered (lapin issue #409): bounded like the confirm.
        match tokio::time::timeout(self.confirm_timeout, sent).await {
            Ok(confirm) => Ok(confirm?),
            Err(_) => Err(format!(
                "the message to {destination} was not reported sent within {:?}",
                self.confirm_timeout
            )
            .into()),
        }
    }

    async fn send_row(&self, row: &OutboxRow) -> Result<PublisherConfirm, BoxError> {
        self.send(
            &row.destination,
            &row.message_id,
            row.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
            &row.payload,
        )
        .await
    }

    /// [`send_row`](Self::send_row), given up at `deadline` (a reconnect included).
    async fn send_row_by(
        &self,
        row: &OutboxRow,
        deadline: tokio::time::Instant,
    ) -> Result<PublisherConfirm, BoxError> {
        match tokio::time::timeout_at(deadline, self.send_row(row)).await {
            Ok(sent) => sent,
            Err(_) => Err(format!(
                "the message to {} was not sent within the confirm timeout ({:?})",
                row.destination, self.confirm_timeout
            )
            .into()),
        }
    }

    /// The broker's confirm as a result, waited for until `deadline`.
    pub(crate) async fn confirmed(
        &self,
        destination: &str,
        confirm: PublisherConfirm,
        deadline: tokio::time::Instant,
    ) -> Result<(), BoxError> {
        match tokio::time::timeout_at(deadline, confirm).await {
            Ok(confirmation) => confirmation_result(destination, confirmation?),
            Err(_) => Err(format!(
                "no confirm from RabbitMQ within {:?} for the message to {destination}",
                self.confirm_timeout
            )
            .into()),
        }
    }

    /// When a confirm awaited from now is overdue.
    pub(crate) fn confirm_deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.confirm_timeout
    }
}

/// A new confirm channel, on the link's connection if it is still up, else on a new one.
async fn reopen(link: &Link, connection: &mut Connection) -> Result<Channel, BrokerError> {
    if !connection.status().connected() {
        *connection = super::errors::connect(&link.uri, link.properties.clone())
            .await
            .map_err(|e| classify("connecting the publisher to RabbitMQ again", e))?;
    }
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| classify("opening the publisher's channel again", e))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| classify("confirm.select on the publisher's new channel", e))?;
    Ok(channel)
}

fn confirmation_result(destination: &str, confirmation: Confirmation) -> Result<(), BoxError> {
    match confirmation {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(returned)) => Err(format!(
            "unroutable: {destination} returned it ({} {})",
            returned.reply_code, returned.reply_text
        )
        .into()),
        Confirmation::Nack(_) => {
            Err(format!("the broker refused the message to {destination}").into())
        }
        Confirmation::NotRequested => Err("publisher confirms are off on this channel".into()),
    }
}

#[async_trait]
impl Publisher for RabbitPublisher {
    fn name(&self) -> &'static str {
        "rabbitmq"
    }

    /// [`confirm_timeout`](Self::confirm_timeout): a call's reconnect, sends and confirms
    /// share it.
    fn delivery_timeout(&self) -> Duration {
        self.confirm_timeout
    }

    async fn publish(&self, row: &OutboxRow) -> Result<(), BoxError> {
        let deadline = self.confirm_deadline();
        let confirm = self.send_row_by(row, deadline).await?;
        self.confirmed(&row.destination, confirm, deadline).await
    }

    /// Sends every row, then awaits the confirms, all within one confirm timeout.
    async fn publish_all(&self, rows: &[OutboxRow]) -> Vec<Result<(), BoxError>> {
        let deadline = self.confirm_deadline();
        let mut sent = Vec::with_capacity(rows.len());
        for row in rows {
            sent.push(self.send_row_by(row, deadline).await);
        }
        let mut results = Vec::with_capacity(rows.len());
        for (row, confirm) in rows.iter().zip(sent) {
            results.push(match confirm {
                Ok(confirm) => self.confirmed(&row.destination, confirm, deadline).await,
                Err(e) => Err(e),
            });
        }
        results
    }
}
