//! [`ConsumerConfig`]: what every broker's consumer shares.

use std::time::Duration;

/// The settings every consumer has, whatever the broker.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use dedup_brokers::ConsumerConfig;
///
/// let config = ConsumerConfig {
///     consumer: Some("billing".into()),
///     in_flight: 32,
///     max_age: Some(Duration::from_secs(3 * 24 * 3600)), // the store's retention
///     ..ConsumerConfig::default()
/// };
/// assert_eq!(config.consumer_name("orders"), "billing");
/// ```
#[derive(Clone, Debug)]
pub struct ConsumerConfig {
    /// The inbox's consumer name (the first half of each [`Key`](dedup_core::Key)). `None`:
    /// the endpoint's name (the queue, the consumer group, the durable consumer), so two
    /// endpoints never share records by accident.
    pub consumer: Option<String>,
    /// Messages in flight at most: the handlers running at once plus deliveries held. It
    /// becomes the broker's own bound (AMQP prefetch, `XREADGROUP COUNT`, JetStream
    /// `max_ack_pending`). At least 1.
    pub in_flight: usize,
    /// How long before a delivery whose handler or store failed is delivered again.
    pub retry_delay: Duration,
    /// The longest wait asked of the broker before a redelivery: a [`Busy`] answer waits
    /// until the other worker's lease expires, at most this long.
    ///
    /// Copies published back to back often meet their twin still running. Each then waits
    /// for the twin's lease, up to 30 s by default. On RabbitMQ it holds an in-flight slot
    /// meanwhile. Lower this when copies often arrive together.
    ///
    /// [`Busy`]: dedup_core::Handled::Busy
    pub max_retry_delay: Duration,
    /// The admission floor: a delivery published longer ago than this (by the broker's
    /// timestamp) is dead-lettered without running the handler, because the store may
    /// already have purged its record and would process it again. Set it to the store's
    /// retention (what you give `purge`); `None` turns the check off. Deliveries without a
    /// timestamp are admitted.
    pub max_age: Option<Duration>,
    /// How long the consumer waits before connecting again after the connection was lost
    /// or a connect failed (a retryable error); it doubles while connecting keeps failing.
    pub reconnect_delay: Duration,
    /// The longest wait between two connect attempts.
    pub max_reconnect_delay: Duration,
    /// How long one connect (connection, subscription, topology check) may take: one that
    /// takes longer is given up and counts as a failed connect, retried after
    /// [`reconnect_delay`](Self::reconnect_delay), so a broker that takes the connection and
    /// never answers does not stall the consumer. At shutdown, also how long the consumer
    /// waits for the broker to stop its deliveries and to take back what was not started.
    pub connect_timeout: Duration,
}

impl Default for ConsumerConfig {
    /// Consumer name from the endpoint, 16 in flight, retry after 1 s (at most 30 s), a
    /// 7-day admission floor, reconnect after 100 ms doubling up to 10 s, 30 s per connect.
    fn default() -> Self {
        ConsumerConfig {
            consumer: None,
            in_flight: 16,
            retry_delay: Duration::from_secs(1),
            max_retry_delay: Duration::from_secs(30),
            max_age: Some(Duration::from_secs(7 * 24 * 3600)),
            reconnect_delay: Duration::from_millis(100),
            max_reconnect_delay: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(30),
        }
    }
}

impl ConsumerConfig {
    /// The consumer name: the configured one, else `endpoint`.
    pub fn consumer_name<'a>(&'a self, endpoint: &'a str) -> &'a str {
        self.consumer.as_deref().unwrap_or(endpoint)
    }

    pub(crate) fn check(&self) -> Result<(), crate::BrokerError> {
        if self.in_flight == 0 {
            return Err(crate::BrokerError::Config(
                "in_flight must be at least 1".into(),
            ));
        }
        if self.max_retry_delay < self.retry_delay {
            return Err(crate::BrokerError::Config(
                "max_retry_delay must not be below retry_delay".into(),
            ));
        }
        if self.reconnect_delay.is_zero() || self.max_reconnect_delay < self.reconnect_delay {
            return Err(crate::BrokerError::Config(
                "reconnect_delay must be above zero and not above max_reconnect_delay".into(),
            ));
        }
        if self.connect_timeout.is_zero() {
            return Err(crate::BrokerError::Config(
                "connect_timeout must be above zero".into(),
            ));
        }
        Ok(())
    }
}
