//! [`NatsPublisher`]: outbox rows to JetStream, each awaited to its stream's ack.

use std::str::FromStr;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, HeaderValue};
use async_nats::jetstream::Context;
use async_nats::jetstream::context::PublishAckFuture;
use async_trait::async_trait;
use dedup_core::BoxError;
use dedup_core::outbox::{OutboxRow, Publisher};

use super::MSG_ID_HEADER;
use crate::PublishTimedOut;

/// [`NatsPublisher::publish_timeout`] unless set.
const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Publishes each row to the subject named by its destination with the `Nats-Msg-Id`
/// header set to its message id and its headers as NATS headers; `Ok` once the stream
/// acknowledged it (also when JetStream recognised it as a copy within its duplicate
/// window: the stream has it). A subject no stream captures is an error (no responders).
///
/// A call (one row, or a batch's sends and acks) answers within
/// [`publish_timeout`](Self::publish_timeout), 10 s by default: its
/// [`delivery_timeout`](Publisher::delivery_timeout), which a relay checks against its hold.
/// The context's own ack timeout (5 s unless set) may end the wait for an ack sooner. A
/// message async-nats buffered while disconnected can still reach the stream after the call
/// gave up; the stream's duplicate window (2 min by default) drops it when the relay's
/// next copy, same `Nats-Msg-Id`, came within it.
///
/// # Errors
///
/// A publish answers `Err` whenever the broker did not confirm: the message may or may not
/// be there. The relay then publishes it again later, with the same message id, and the
/// consumer's inbox drops the copy.
///
/// # Cancel safety
///
/// A dropped publish may still reach the broker: async-nats may have buffered it. The relay counts its rows as not
/// published, and publishes them again.
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
/// use dedup_core::outbox::{OutboxStore, Relay};
///
/// # async fn example(outbox: Arc<dyn OutboxStore>) -> Result<(), dedup_core::BoxError> {
/// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
/// let publisher = dedup_brokers::nats::NatsPublisher::from_client(client);
/// let relay = Relay::new(outbox, Arc::new(publisher)).start()?;
/// // ... on shutdown:
/// relay.stop().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct NatsPublisher {
    js: Context,
    publish_timeout: Duration,
}

impl NatsPublisher {
    /// A publisher over a JetStream context.
    pub fn new(js: Context) -> Self {
        NatsPublisher {
            js,
            publish_timeout: DEFAULT_PUBLISH_TIMEOUT,
        }
    }

    /// How long a call may wait for the stream's acks in all before its rows count as
    /// failed (10 s by default).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// The error of a row whose call ran out of time.
    fn timed_out(&self, row: &OutboxRow) -> PublishTimedOut {
        PublishTimedOut {
            publisher: "nats",
            destination: row.destination.clone(),
            timeout: self.publish_timeout,
        }
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

    /// [`publish_timeout`](Self::publish_timeout).
    fn delivery_timeout(&self) -> Duration {
        self.publish_timeout
    }

    async fn publish(&self, row: &OutboxRow) -> Result<(), BoxError> {
        let deadline = tokio::time::Instant::now() + self.publish_timeout;
        self.timed_out(row)
            .unless(deadline, async {
                send_row(&self.js, row).await?.await?;
                Ok(())
            })
            .await
    }

    /// Sends every row, then awaits the acks, all within one publish timeout.
    async fn publish_all(&self, rows: &[OutboxRow]) -> Vec<Result<(), BoxError>> {
        let deadline = tokio::time::Instant::now() + self.publish_timeout;
        let mut sent = Vec::with_capacity(rows.len());
        for row in rows {
            let send = send_row(&self.js, row);
            sent.push(self.timed_out(row).unless(deadline, send).await);
        }
        let mut results = Vec::with_capacity(rows.len());
        for (row, ack) in rows.iter().zip(sent) {
            results.push(match ack {
                Ok(ack) => {
                    let ack = async { ack.await.map(drop).map_err(Into::into) };
                    self.timed_out(row).unless(deadline, ack).await
                }
                Err(e) => Err(e),
            });
        }
        results
    }
}
