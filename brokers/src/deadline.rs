//! [`PublishTimedOut`]: a publisher's call given up at its deadline.

use std::time::Duration;

/// A publish that got no answer from the broker within the publisher's timeout (its
/// [`delivery_timeout`](dedup_core::outbox::Publisher::delivery_timeout)). The message may
/// or may not be at the broker: the relay publishes the row again later, with the same
/// message id.
#[derive(Clone, Debug, thiserror::Error)]
#[error("no answer from {publisher} for the message to {destination} within {timeout:?}")]
pub struct PublishTimedOut {
    /// The publisher's name (`nats`, `pubsub`, `redis-streams`).
    pub publisher: &'static str,
    /// The row's destination.
    pub destination: String,
    /// The publisher's timeout.
    pub timeout: Duration,
}

#[cfg(any(feature = "nats", feature = "pubsub", feature = "redis-streams"))]
impl PublishTimedOut {
    /// `call`'s answer, or this error when `deadline` comes first (`call` is dropped).
    pub(crate) async fn unless<T>(
        self,
        deadline: tokio::time::Instant,
        call: impl std::future::Future<Output = Result<T, dedup_core::BoxError>>,
    ) -> Result<T, dedup_core::BoxError> {
        match tokio::time::timeout_at(deadline, call).await {
            Ok(answer) => answer,
            Err(_) => Err(Box::new(self)),
        }
    }
}
