//! Broker adapters for dedup: outbox [`Publisher`](dedup_core::outbox::Publisher)s and
//! inbox consumers.
//!
//! Each broker is a cargo feature and a module:
//!
//! | feature | module | consumer | publisher |
//! |---|---|---|---|
//! | `rabbitmq` | `rabbitmq` | `RabbitConsumer` | `RabbitPublisher` |
//! | `redis-streams` | `redis_streams` | `StreamConsumer` | `StreamPublisher` |
//! | `nats` | `nats` | `NatsConsumer` | `NatsPublisher` |
//! | `kafka` | `kafka` | `KafkaConsumer` | `KafkaPublisher` |
//! | `pubsub` | `pubsub` | `PubSubConsumer` | `PubSubPublisher` |
//!
//! A consumer does the same for every broker:
//! 1. It takes each delivery's message id from the broker's id property.
//! 2. It refuses a delivery without one, or older than the admission floor
//!    ([`ConsumerConfig::max_age`]). A refused delivery is dead-lettered, with a reason.
//! 3. It runs a [`Handle`]: an [`Inbox`](dedup_core::Inbox) in lease mode through
//!    [`with_inbox`], or a transactional inbox's transaction through [`with_tx_inbox`].
//! 4. It turns the answer into one broker [`Action`] ([`action_for`]): ack, retry after a
//!    delay, or dead-letter.
//!
//! It keeps at most [`ConsumerConfig::in_flight`] messages in flight. It reconnects
//! after a lost connection. It stops gracefully on a [`Shutdown`]. That receive loop is
//! written once ([`consume`]) over a [`Source`]. The broker-specific parts live in one
//! module per broker: how to connect, fetch, ack, nack, dead-letter and reclaim. The
//! crate README gives each broker's choices.
//!
//! # Examples
//!
//! A consumer's life, on RabbitMQ (feature `rabbitmq`):
//!
//! ```no_run
//! # #[cfg(feature = "rabbitmq")]
//! # async fn example() -> Result<(), dedup_core::BoxError> {
//! use dedup_brokers::rabbitmq::RabbitConsumer;
//! use dedup_brokers::{ConsumerConfig, shutdown, with_inbox};
//! use dedup_core::{BoxError, Inbox, MemoryStore};
//!
//! let inbox = Inbox::new(MemoryStore::new()); // your store
//! let handler = with_inbox(inbox, |lease, delivery| async move {
//!     println!("charging, key {}", lease.idempotency_key());
//!     let _ = delivery.payload;
//!     Ok::<_, BoxError>(None)
//! });
//! let consumer = RabbitConsumer::from_uri("amqp://127.0.0.1:5672", "orders", ConsumerConfig::default());
//! let (stop, signal) = shutdown();
//! let running = tokio::spawn(consumer.run(handler, signal));
//! // ... on SIGTERM:
//! stop.shut_down();
//! let stats = running.await??;
//! println!("{stats:?}");
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod action;
pub mod backlog;
mod config;
mod consume;
#[cfg(any(
    feature = "kafka",
    feature = "nats",
    feature = "pubsub",
    feature = "rabbitmq",
    feature = "redis-streams"
))]
mod consumer;
mod deadline;
mod delivery;
mod error;
mod fault;
mod handle;
mod health;
mod in_flight;
pub mod replay;
mod shutdown;
mod source;
mod tx_handler;

#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub mod kafka;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
#[cfg(feature = "pubsub")]
#[cfg_attr(docsrs, doc(cfg(feature = "pubsub")))]
pub mod pubsub;
#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub mod rabbitmq;
#[cfg(feature = "redis-streams")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis-streams")))]
pub mod redis_streams;

pub use action::{Action, ConsumerStats, action_for, refusal};
pub use config::ConsumerConfig;
pub use consume::{consume, consume_with_health};
pub use deadline::PublishTimedOut;
pub use delivery::Delivery;
pub use error::BrokerError;
pub use fault::{
    FAILURE_ATTEMPTS_HEADER, FAILURE_CONSUMER_HEADER, FAILURE_KIND_HEADER, FAILURE_MESSAGE_HEADER,
    FAILURE_TIME_HEADER, Fault, MAX_FAILURE_HEADER_LEN,
};
pub use handle::{Handle, InboxHandler, with_inbox};
pub use health::{ConsumerProbe, Health, HealthSnapshot};
pub use shutdown::{Shutdown, ShutdownTrigger, shutdown};
pub use source::{Pending, Source};
pub use tx_handler::{TxInboxHandler, with_tx_inbox};

/// The header (AMQP, NATS, Kafka) or stream field (Redis) a dead letter carries its reason in.
pub const DEAD_LETTER_REASON: &str = "x-dedup-dead-letter-reason";

/// The README's snippet, compiled as a doc test (it needs a broker to run).
#[cfg(all(doctest, feature = "rabbitmq"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
