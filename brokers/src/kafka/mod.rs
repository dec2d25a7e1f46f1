//! Kafka (rdkafka, bundled librdkafka): [`KafkaPublisher`] and [`KafkaConsumer`].
//!
//! The message id travels as the [`MESSAGE_ID_HEADER`] header (`message-id`); a
//! destination is a topic name. See the crate README for what the consumer commits when,
//! and what its offset fallback for messages without the header cannot deduplicate.

mod backlog;
mod consumer;
mod dead_letters;
mod errors;
mod offsets;
mod pending;
mod publisher;

pub use backlog::KafkaLag;
pub use consumer::KafkaConsumer;
pub use dead_letters::KafkaDeadLetters;
pub use pending::KafkaPending;
pub use publisher::{DEFAULT_MESSAGE_TIMEOUT, KafkaPublisher};

/// The header that carries a message's id (what the inbox keys on).
pub const MESSAGE_ID_HEADER: &str = "message-id";

/// The header a retried copy carries: how many times it was sent back so far.
pub const RETRIES_HEADER: &str = "x-dedup-retries";

/// The header a retried or dead-lettered copy carries: `topic/partition/offset` of the
/// record it copies.
pub const ORIGIN_HEADER: &str = "x-dedup-origin";

/// The header of a settle marker on a dead-letter topic: the `partition/offset` of the copy
/// a replay put back (see [`KafkaDeadLetters`]).
pub const SETTLED_HEADER: &str = "x-dedup-settled";
