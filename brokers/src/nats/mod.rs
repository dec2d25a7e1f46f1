//! NATS JetStream (async-nats): [`NatsPublisher`] and [`NatsConsumer`].
//!
//! The message id travels in the `Nats-Msg-Id` header, which JetStream also uses to drop
//! copies published within the stream's duplicate window; the inbox drops the rest.

mod backlog;
mod consumer;
mod dead_letters;
mod errors;
mod pending;
mod publisher;

pub use backlog::NatsBacklog;
pub use consumer::NatsConsumer;
pub use dead_letters::NatsDeadLetters;
pub use pending::NatsPending;
pub use publisher::NatsPublisher;

/// The header holding the message id.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// The header a dead-lettered copy carries: the subject the original was read from.
pub const ORIGIN_HEADER: &str = "x-dedup-origin";
