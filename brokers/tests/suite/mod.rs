//! The broker conformance suite: the scenarios every consumer must pass, written once over
//! a [`BrokerFactory`], and run by each broker's test file through [`broker_suite!`] (one
//! named `#[tokio::test]` per clause). [`broken`] holds deliberately broken adapters, with
//! which a clause must fail.
#![allow(dead_code)] // each test file uses a part

pub mod broken;
pub mod clauses;

use async_trait::async_trait;
use dedup_brokers::{ConsumerConfig, Source};

/// A message found at the broker's dead-letter destination.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    /// Its message id, if it carries one.
    pub message_id: Option<String>,
    /// Its payload.
    pub payload: Vec<u8>,
    /// The reason the consumer gave (`DEAD_LETTER_REASON`).
    pub reason: Option<String>,
    /// Every header (stream field, attribute) the copy carries whose value is text.
    pub headers: Vec<(String, String)>,
}

impl DeadLetter {
    /// The header `name`, if the copy carries it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What a broker gives the suite: a fresh endpoint (queue, stream, durable consumer) per
/// clause, a way to publish to it, sources consuming it, and a look at what it holds.
#[async_trait]
pub trait BrokerFactory: Send + Sync + Sized + 'static {
    /// The broker's consumer, as the receive loop sees it.
    type Source: Source;

    /// A fresh endpoint; `None` when the server is not configured (and not strict).
    async fn new() -> Option<Self>;

    /// Publish one message per id, in order, each kept by the broker (also repeated ids).
    async fn publish(&self, ids: &[String]);

    /// Publish a message without a message id.
    async fn publish_without_id(&self, payload: &[u8]);

    /// A consumer of the endpoint as `worker` (one connection of its own per worker).
    async fn source(&self, worker: &str, config: &ConsumerConfig) -> Self::Source;

    /// After a worker's `run` task was aborted: whatever the broker needs to see it dead
    /// (close its connection). Nothing by default.
    async fn kill(&self, _worker: &str) {}

    /// Everything at the dead-letter destination so far.
    async fn dead_letters(&self) -> Vec<DeadLetter>;

    /// Messages of the endpoint not settled yet (ready, or delivered and not acked).
    async fn outstanding(&self) -> u64;

    /// Remove the endpoint.
    async fn cleanup(self);
}

/// One `#[tokio::test]` per clause of [`clauses`] for a [`BrokerFactory`] type.
macro_rules! broker_suite {
    ($factory:ty) => {
        $crate::suite::__broker_clauses!($factory;
            same_id_published_n_times_is_handled_once,
            a_delivery_without_an_id_is_dead_lettered_never_handled,
            a_consumer_killed_mid_handler_has_its_redelivery_absorbed,
            the_in_flight_bound_is_never_exceeded,
            shutdown_settles_every_started_delivery,
            with_one_in_flight_order_is_kept,
            a_retry_comes_back_after_its_delay,
            a_message_past_its_attempt_limit_reaches_the_dead_letters,
            a_delivery_carries_its_trace_and_the_handler_runs_in_it,
            a_dead_lettered_copy_carries_its_cause,
        );
    };
}

macro_rules! __broker_clauses {
    ($factory:ty; $($clause:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $clause() {
                let Some(fx) = <$factory as $crate::suite::BrokerFactory>::new().await else {
                    return;
                };
                $crate::suite::clauses::$clause(fx).await;
            }
        )*
    };
}

pub(crate) use {__broker_clauses, broker_suite};
