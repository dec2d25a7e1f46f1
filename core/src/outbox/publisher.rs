//! [`Publisher`]: how a relay hands rows to a broker; [`MemoryPublisher`] for tests.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::OutboxRow;
use crate::BoxError;

/// Sends outbox rows to a broker. The relay marks a row sent only after `publish` returned
/// `Ok`, so `Ok` must mean the broker has the message (a publisher confirm, an `XADD`
/// reply, a JetStream ack), not that it was written to a socket.
///
/// Publishers set [`OutboxRow::message_id`] as the broker's message id (AMQP
/// `message_id`, a stream entry field, `Nats-Msg-Id`): the relay publishes at least once,
/// and the consumer's inbox uses that id to drop the copies.
///
/// # Time
///
/// A relay holds the rows it publishes for [`RelayConfig::hold`](super::RelayConfig::hold);
/// after that another relay may take them again. So a publish must be over, one way or the
/// other, before the hold ends: a message that can still reach the broker after its row was
/// taken again becomes a second copy on the broker. Each publisher says how long that can
/// take ([`delivery_timeout`](Self::delivery_timeout)), and a relay refuses to start when
/// that outlasts its hold ([`Error::PublisherOutlastsHold`](crate::Error::PublisherOutlastsHold)).
#[async_trait]
pub trait Publisher: Send + Sync + fmt::Debug {
    /// A short name for metrics and logs (`rabbitmq`, `redis-streams`, `memory`).
    fn name(&self) -> &'static str;

    /// The longest one call of [`publish`](Self::publish) or
    /// [`publish_all`](Self::publish_all) can take from its start until no message it sent
    /// can still reach the broker: a call answers within it (an error when the broker did
    /// not confirm in time), and whatever the client library still queued for it is
    /// dropped by then (Kafka's `message.timeout.ms`).
    ///
    /// A relay checks `delivery_timeout + mark_margin <= hold` when it starts, and stops
    /// waiting for a call at `hold - mark_margin` whatever this answers (the rows still
    /// unanswered then count as failed).
    fn delivery_timeout(&self) -> Duration;

    /// Publish one row; `Ok` once the broker confirmed it.
    async fn publish(&self, row: &OutboxRow) -> Result<(), BoxError>;

    /// Publish `rows` (at most one per ordering key, so their order among themselves does
    /// not matter) and answer for each, in order. The default publishes them concurrently
    /// with [`publish`](Self::publish); a publisher with a cheaper batch form overrides it.
    async fn publish_all(&self, rows: &[OutboxRow]) -> Vec<Result<(), BoxError>> {
        futures::future::join_all(rows.iter().map(|row| self.publish(row))).await
    }
}

#[async_trait]
impl<P: Publisher + ?Sized> Publisher for Arc<P> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn delivery_timeout(&self) -> Duration {
        (**self).delivery_timeout()
    }
    async fn publish(&self, row: &OutboxRow) -> Result<(), BoxError> {
        (**self).publish(row).await
    }
    async fn publish_all(&self, rows: &[OutboxRow]) -> Vec<Result<(), BoxError>> {
        (**self).publish_all(rows).await
    }
}

/// An in-process publisher that keeps what it was given, for tests and examples. It can
/// be told to fail a destination, or one message id, a number of times (or always).
#[derive(Clone, Debug, Default)]
pub struct MemoryPublisher {
    inner: Arc<Mutex<MemoryInner>>,
}

#[derive(Debug, Default)]
struct MemoryInner {
    published: Vec<OutboxRow>,
    failures: HashMap<String, Option<u32>>,
}

/// The error [`MemoryPublisher`] answers when told to fail.
#[derive(Debug, thiserror::Error)]
#[error("memory publisher told to fail {0}")]
pub struct InjectedFailure(pub String);

impl MemoryPublisher {
    /// An empty publisher that accepts everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fail the next `times` publishes to `destination_or_id` (a destination or a message
    /// id); `None`: always.
    pub fn fail(&self, destination_or_id: &str, times: Option<u32>) {
        self.lock()
            .failures
            .insert(destination_or_id.to_owned(), times);
    }

    /// Everything published, in the order it was accepted (copies included).
    pub fn published(&self) -> Vec<OutboxRow> {
        self.lock().published.clone()
    }

    /// The message ids published, in order.
    pub fn message_ids(&self) -> Vec<String> {
        self.lock()
            .published
            .iter()
            .map(|r| r.message_id.clone())
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Publisher for MemoryPublisher {
    fn name(&self) -> &'static str {
        "memory"
    }

    /// Zero: a publish answers at once and leaves nothing behind.
    fn delivery_timeout(&self) -> Duration {
        Duration::ZERO
    }

    async fn publish(&self, row: &OutboxRow) -> Result<(), BoxError> {
        let mut inner = self.lock();
        for name in [&row.message_id, &row.destination] {
            if let Some(times) = inner.failures.get_mut(name.as_str()) {
                match times {
                    None => return Err(InjectedFailure(name.clone()).into()),
                    Some(0) => {}
                    Some(n) => {
                        *n -= 1;
                        return Err(InjectedFailure(name.clone()).into());
                    }
                }
            }
        }
        inner.published.push(row.clone());
        Ok(())
    }
}
