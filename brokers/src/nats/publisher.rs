//! [`NatsPublisher`]: outbox rows to JetStream, each awaited to its stream's ack.

use std::str::FromStr;

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, HeaderValue};
use async_nats::jetstream::Context;
use async_nats::jetstream::context::PublishAckFuture;
use async_trait::async_trait;
use dedup_core::BoxError;
use dedup_core::outbox::{OutboxRow, Publisher};

use super::MSG_ID_HEADER;

/// Publishes each row to the subject named by its destination with the `Nats-Msg-Id`
/// header set to its message id and its headers as NATS headers; `Ok` once the stream
/// acknowledged it (also when JetStream recognised it as a copy within its duplicate
/// window: the stream has it). A subject no stream captures is an error (no responders).
#[derive(Clone, Debug)]
pub struct NatsPublisher {
    js: Context,
}

impl NatsPublisher {
    /// A publisher over a JetStream context.
    pub fn new(js: Context) -> Self {
        NatsPublisher { js }
    }

    /// A publisher over `client`'s default JetStream context.
    pub fn from_client(client: async_nats::Client) -> Self {
        Self::new(async_nats::jetstream::new(client))
    }
}

/// `pairs` as NATS headers, refusing names or values NATS cannot carry.
pub(crate) fn headers<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<HeaderMap, BoxError> {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        let name = HeaderName::from_str(name).map_err(|e| format!("header {name:?}: {e}"))?;
        let value = HeaderValue::from_str(value).map_err(|e| format!("header value: {e}"))?;
        map.append(name, value);
    }
    Ok(map)
}

pub(crate) async fn send(
    js: &Context,
    subject: &str,
    headers: HeaderMap,
    payload: bytes::Bytes,
) -> Result<PublishAckFuture, BoxError> {
    Ok(js
        .publish_with_headers(subject.to_owned(), headers, payload)
        .await?)
}

async fn send_row(js: &Context, row: &OutboxRow) -> Result<PublishAckFuture, BoxError> {
    let map = headers(
        std::iter::once((MSG_ID_HEADER, row.message_id.as_str()))
            .chain(row.headers.iter().map(|(n, v)| (n.as_str(), v.as_str()))),
    )?;
    send(js, &row.destination, map, row.payload.clone().into()).await
}

#[async_trait]
impl Publisher for NatsPublisher {
    fn name(&self) -> &'static str {
        "nats"
    }

    async fn publish(&self, row: &OutboxRow) -> Result<(), BoxError> {
        send_row(&self.js, row).await?.await?;
        Ok(())
    }

    /// Sends every row, then awaits the acks.
    async fn publish_all(&self, rows: &[OutboxRow]) -> Vec<Result<(), BoxError>> {
        let mut sent = Vec::with_capacity(rows.len());
        for row in rows {
            sent.push(send_row(&self.js, row).await);
        }
        let mut results = Vec::with_capacity(rows.len());
        for ack in sent {
            results.push(match ack {
                Ok(ack) => ack.await.map(drop).map_err(Into::into),
                Err(e) => Err(e),
            });
        }
        results
    }
}
