//! Broker adapters for dedup: outbox [`Publisher`](dedup_core::outbox::Publisher)s and
//! inbox consumers for RabbitMQ (feature `rabbitmq`), Redis Streams (`redis-streams`),
//! NATS JetStream (`nats`), Kafka (`kafka`) and Google Cloud Pub/Sub (`pubsub`).
//!
//! A consumer takes each delivery's message id from the broker's id property, refuses
//! (dead-letters, with a reason) a delivery without one or older than the admission floor,
//! runs a [`Handle`] (an [`Inbox`](dedup_core::Inbox) in lease mode through
//! [`with_inbox`], or a transactional inbox's transaction through [`with_tx_inbox`]), and turns the answer into
//! one broker [`Action`] ([`action_for`]: ack, retry after a delay, dead-letter). It keeps at
//! most [`ConsumerConfig::in_flight`] messages in flight and stops gracefully on a
//! [`Shutdown`]. That receive loop is written once ([`consume`]) over a [`Source`]; the
//! broker-specific parts (how to connect, fetch, ack, nack, dead-letter, reclaim) live in one
//! folder per broker; see the crate README for each broker's choices.

mod action;
mod config;
mod consume;
mod delivery;
mod error;
mod fault;
mod handle;
mod health;
mod in_flight;
mod shutdown;
mod source;
mod tx_handler;

#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "pubsub")]
pub mod pubsub;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "redis-streams")]
pub mod redis_streams;

pub use action::{Action, ConsumerStats, action_for, refusal};
pub use config::ConsumerConfig;
pub use consume::{consume, consume_with_health};
pub use delivery::Delivery;
pub use error::BrokerError;
pub use fault::{
    FAILURE_ATTEMPTS_HEADER, FAILURE_CONSUMER_HEADER, FAILURE_KIND_HEADER, FAILURE_MESSAGE_HEADER,
    FAILURE_TIME_HEADER, Fault, MAX_FAILURE_HEADER_LEN,
};
pub use handle::{Handle, InboxHandler, with_inbox};
pub use health::{Health, HealthSnapshot};
pub use shutdown::{Shutdown, ShutdownTrigger, shutdown};
pub use source::{Pending, Source};
pub use tx_handler::{TxInboxHandler, with_tx_inbox};

/// The header (AMQP, NATS, Kafka) or stream field (Redis) a dead letter carries its reason in.
pub const DEAD_LETTER_REASON: &str = "x-dedup-dead-letter-reason";

/// The README's snippet, compiled as a doc test (it needs a broker to run).
#[cfg(all(doctest, feature = "rabbitmq"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
