//! [`consume`]: the one receive loop every broker's consumer runs over its [`Source`].

use std::sync::Arc;
use std::time::Duration;

use crate::action::{Counters, decide};
use crate::in_flight::InFlight;
use crate::source::{Pending, Source};
use crate::{BrokerError, ConsumerConfig, ConsumerStats, Handle, Health, Shutdown};

/// Consumes `source` through `handler` until `shutdown` fires or an error no retry can fix.
///
/// Each broker's consumer `run` calls this. Call it yourself for a [`Source`] of your own.
///
/// Each round it waits for free in-flight slots and fetches at most that many deliveries.
/// It starts each one:
/// 1. admission ([`refusal`](crate::refusal));
/// 2. the handler, in a `dedup.consume` span with the delivery's
///    [`MessageTrace`](dedup_core::trace::MessageTrace) in scope (see
///    [`Delivery::trace`](crate::Delivery::trace));
/// 3. the answer mapped to an [`Action`](crate::Action)
///    ([`action_for`](crate::action_for));
/// 4. the action settled with the broker.
///
/// A retryable error (a lost connection, a restarting broker) makes it connect again.
/// It waits [`ConsumerConfig::reconnect_delay`] first, doubling up to
/// [`ConsumerConfig::max_reconnect_delay`] while connecting keeps failing. Handlers
/// already started keep running meanwhile.
///
/// At shutdown it stops the broker's deliveries and lets the started handlers finish and
/// settle. It gives back what it holds unstarted. Then it returns the counts.
///
/// # Errors
///
/// - [`BrokerError::Config`]: an invalid `config`, or one the source refuses. Nothing
///   was consumed.
/// - An error that is not retryable ([`BrokerError::is_retryable`]): refused
///   credentials, a missing queue. It ends the loop after the started handlers settled.
///
/// # Cancel safety
///
/// Dropping the future is not a graceful stop: fire `shutdown` instead. Handlers
/// already started are aborted at their next await point. An
/// [`Inbox`](dedup_core::Inbox) releases their leases in the background. The broker
/// delivers again what was not settled.
pub async fn consume<S: Source, H: Handle>(
    source: S,
    config: ConsumerConfig,
    handler: H,
    shutdown: Shutdown,
) -> Result<ConsumerStats, BrokerError> {
    consume_with_health(source, config, handler, shutdown, Health::default()).await
}

/// [`consume`], keeping `health` up to date for probes.
///
/// `health` tracks whether it is connected, the messages in flight, the last settle and
/// the reconnects. Each broker's consumer runs this with the [`Health`] its `health()`
/// hands out.
///
/// # Errors
///
/// As [`consume`].
///
/// # Cancel safety
///
/// As [`consume`].
pub async fn consume_with_health<S: Source, H: Handle>(
    mut source: S,
    config: ConsumerConfig,
    handler: H,
    shutdown: Shutdown,
    health: Health,
) -> Result<ConsumerStats, BrokerError> {
    config.check()?;
    source.check(&config)?;
    let endpoint = source.endpoint().to_owned();
    let shared = Arc::new(Shared {
        consumer: config.consumer_name(source.endpoint()).to_owned(),
        config: config.clone(),
        handler,
        counters: Counters::default(),
        shutdown: shutdown.clone(),
        health: health.clone(),
    });
    let mut in_flight = InFlight::new(config.in_flight);
    let mut connected = false;
    let mut delay = config.reconnect_delay;
    let mut failure = None;
    loop {
        if !connected {
            // A connect ends at shutdown, and is given up after `connect_timeout`.
            let attempt = tokio::select! {
                biased;
                _ = shutdown.wait() => break,
                attempt = tokio::time::timeout(config.connect_timeout, source.connect(&config)) => attempt,
            };
            let attempt = attempt.unwrap_or_else(|_| {
                Err(BrokerError::broker(
                    format!("connecting to {endpoint}"),
                    format!("no answer within {:?}", config.connect_timeout),
                ))
            });
            match attempt {
                Ok(()) => {
                    connected = true;
                    health.set_connected(true);
                    delay = config.reconnect_delay;
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(endpoint = source.endpoint(), error = %dedup_core::error_chain(&e), retry_in = ?delay, "could not connect; retrying");
                    if !pause(delay, &shutdown).await {
                        break;
                    }
                    delay = (delay * 2).min(config.max_reconnect_delay);
                    continue;
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let permits = in_flight.slots(&shutdown).await;
        if permits.is_empty() {
            break;
        }
        match source.fetch(permits.len(), &shutdown).await {
            Ok(fetched) => {
                let mut permits = permits.into_iter();
                for pending in fetched {
                    // A source handing over more than asked still gets no more than the
                    // bound running: the rest wait for slots (or, at shutdown, go back
                    // unsettled: the broker delivers them again).
                    let permit = match permits.next() {
                        Some(permit) => permit,
                        None => match in_flight.slot(&shutdown).await {
                            Some(permit) => permit,
                            None => break,
                        },
                    };
                    let shared = Arc::clone(&shared);
                    in_flight
                        .start(permit, async move { shared.settle(pending).await })
                        .await;
                }
            }
            Err(e) if e.is_retryable() => {
                tracing::warn!(endpoint = source.endpoint(), error = %dedup_core::error_chain(&e), "connection lost; reconnecting");
                Counters::bump(&shared.counters.reconnects);
                health.reconnecting();
                connected = false;
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    if connected {
        bounded(&config, &endpoint, "stopping the deliveries", source.stop()).await;
    }
    health.set_connected(false);
    in_flight.drain().await;
    if connected && failure.is_none() {
        let what = "giving back what was not started";
        bounded(&config, &endpoint, what, source.give_back()).await;
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(shared.counters.snapshot()),
    }
}

/// A shutdown step with the broker, given up (and logged) after `connect_timeout`: what it
/// did not do, the broker does itself when the connection goes (redelivers what was held).
async fn bounded(
    config: &ConsumerConfig,
    endpoint: &str,
    what: &str,
    step: impl Future<Output = ()>,
) {
    if tokio::time::timeout(config.connect_timeout, step)
        .await
        .is_err()
    {
        tracing::warn!(endpoint, step = what, limit = ?config.connect_timeout, "shutdown step not done in time; left to the broker");
    }
}

/// Sleep `delay` unless `shutdown` fires first: whether the whole delay passed.
async fn pause(delay: Duration, shutdown: &Shutdown) -> bool {
    tokio::select! {
        biased;
        _ = shutdown.wait() => false,
        _ = tokio::time::sleep(delay) => true,
    }
}

struct Shared<H> {
    consumer: String,
    config: ConsumerConfig,
    handler: H,
    counters: Counters,
    shutdown: Shutdown,
    health: Health,
}

impl<H: Handle> Shared<H> {
    async fn settle<P: Pending>(&self, pending: P) {
        self.health.started();
        let action = decide(
            &self.handler,
            &self.consumer,
            pending.delivery(),
            &self.config,
            &self.counters,
        )
        .await;
        let broker_ref = pending.delivery().broker_ref.clone();
        let settled = pending.settle(action, &self.shutdown).await;
        self.health.finished(settled.is_ok());
        if let Err(e) = settled {
            // Not settled: the broker delivers it again (requeued with the channel,
            // left pending, or past its ack wait).
            tracing::warn!(consumer = %self.consumer, %broker_ref, error = %dedup_core::error_chain(&e), "could not settle a delivery");
            Counters::bump(&self.counters.settle_errors);
        }
    }
}

#[cfg(test)]
mod tests;
