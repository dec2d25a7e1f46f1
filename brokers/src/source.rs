//! [`Source`]: what a broker gives the one receive loop ([`consume`](crate::consume)):
//! connect, fetch, and settle each delivery.

use async_trait::async_trait;

use crate::{Action, BrokerError, ConsumerConfig, Delivery, Shutdown};

/// A broker endpoint the receive loop consumes: everything that is the broker's own (how to
/// connect and subscribe, fetch, and settle), nothing the loop does for every broker
/// (in-flight bound, admission, handler, counters, reconnect backoff, drain).
///
/// The loop calls [`connect`](Self::connect) before the first [`fetch`](Self::fetch) and
/// again after any retryable error ([`BrokerError::is_retryable`]), with a growing delay
/// between attempts; a source drops whatever it held of the old connection there. A
/// [`Pending`] delivery fetched before a reconnect may fail to settle: the broker then
/// delivers it again, and the inbox answers the copy.
#[async_trait]
pub trait Source: Send + 'static {
    /// One delivery and what settles it with the broker.
    type Pending: Pending;

    /// The endpoint's name (queue, consumer group, durable consumer): the inbox's consumer
    /// name unless [`ConsumerConfig::consumer`] sets one.
    fn endpoint(&self) -> &str;

    /// Check what can be checked before connecting (nothing is started on an error).
    fn check(&self, _config: &ConsumerConfig) -> Result<(), BrokerError> {
        Ok(())
    }

    /// (Re)connect and subscribe, asking the broker for at most `config.in_flight`
    /// deliveries at once where it can bound them. The loop drops this future when it takes
    /// longer than [`ConsumerConfig::connect_timeout`] or shutdown fires: whatever it left
    /// half done, the next call starts over from.
    async fn connect(&mut self, config: &ConsumerConfig) -> Result<(), BrokerError>;

    /// Up to `max` deliveries (at least one, or none after a short wait). May return early
    /// with none once `shutdown` fires, if it can do so without taking deliveries it would
    /// then hold unstarted.
    async fn fetch(
        &mut self,
        max: usize,
        shutdown: &Shutdown,
    ) -> Result<Vec<Self::Pending>, BrokerError>;

    /// At shutdown, before the started handlers are awaited: stop the broker's deliveries.
    /// Given up after [`ConsumerConfig::connect_timeout`].
    async fn stop(&mut self) {}

    /// At shutdown, after every started delivery settled: give back what was received but
    /// not started (what is not given back, the broker redelivers later by itself). Given up
    /// after [`ConsumerConfig::connect_timeout`].
    async fn give_back(&mut self) {}
}

/// One delivery a [`Source`] fetched: the broker-neutral [`Delivery`] the handler reads,
/// and how to settle it.
#[async_trait]
pub trait Pending: Send + 'static {
    /// The delivery, as the handler sees it.
    fn delivery(&self) -> &Delivery;

    /// Apply `action` to this delivery with the broker. A retry whose delay the broker
    /// cannot take itself waits here, and ends its wait when `shutdown` fires. An error
    /// means the broker did not take the action; it delivers the message again later.
    async fn settle(self, action: Action, shutdown: &Shutdown) -> Result<(), BrokerError>;
}
