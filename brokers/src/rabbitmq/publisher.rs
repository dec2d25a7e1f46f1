//! [`RabbitPublisher`]: outbox rows to RabbitMQ with publisher confirms.

use std::time::SystemTime;

use async_trait::async_trait;
use dedup_core::BoxError;
use dedup_core::outbox::{OutboxRow, Publisher};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection};
use lapin::{Confirmation, PublisherConfirm};

use super::split_destination;

/// Publishes outbox rows to RabbitMQ on a channel of its own in confirm mode: `Ok` once the
/// broker confirmed (an unroutable message, returned by the broker, is an error: publishes
/// are `mandatory`). The row's `message_id` becomes the AMQP `message_id` property, its
/// headers AMQP string headers, the publish time the `timestamp` property (seconds; what
/// the consumer's admission floor reads); messages are persistent (delivery mode 2).
/// Destination: `exchange` or `exchange/routing-key` (see [the module](super)).
#[derive(Clone, Debug)]
pub struct RabbitPublisher {
    channel: Channel,
}

impl RabbitPublisher {
    /// A publisher on a new channel of `connection`, with confirms on.
    pub async fn new(connection: &Connection) -> Result<Self, lapin::Error> {
        Self::from_channel(connection.create_channel().await?).await
    }

    /// A publisher on `channel` (which it puts in confirm mode; do not share it with
    /// publishers that expect no confirms).
    pub async fn from_channel(channel: Channel) -> Result<Self, lapin::Error> {
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(RabbitPublisher { channel })
    }

    /// Send one message; the confirm is awaited separately.
    pub(crate) async fn send(
        &self,
        destination: &str,
        message_id: &str,
        headers: impl IntoIterator<Item = (&str, &str)>,
        payload: &[u8],
    ) -> Result<PublisherConfirm, lapin::Error> {
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
        self.channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                payload,
                props,
            )
            .await
    }

    async fn send_row(&self, row: &OutboxRow) -> Result<PublisherConfirm, lapin::Error> {
        self.send(
            &row.destination,
            &row.message_id,
            row.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
            &row.payload,
        )
        .await
    }
}

/// The broker's confirm as a result.
pub(crate) async fn confirmed(
    destination: &str,
    confirm: PublisherConfirm,
) -> Result<(), BoxError> {
    match confirm.await? {
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

    async fn publish(&self, row: &OutboxRow) -> Result<(), BoxError> {
        let confirm = self.send_row(row).await?;
        confirmed(&row.destination, confirm).await
    }

    /// Sends every row, then awaits the confirms.
    async fn publish_all(&self, rows: &[OutboxRow]) -> Vec<Result<(), BoxError>> {
        let mut sent = Vec::with_capacity(rows.len());
        for row in rows {
            sent.push(self.send_row(row).await);
        }
        let mut results = Vec::with_capacity(rows.len());
        for (row, confirm) in rows.iter().zip(sent) {
            results.push(match confirm {
                Ok(confirm) => confirmed(&row.destination, confirm).await,
                Err(e) => Err(e.into()),
            });
        }
        results
    }
}
