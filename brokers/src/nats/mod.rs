//! NATS JetStream (async-nats): [`NatsPublisher`] and [`NatsConsumer`].
//!
//! The message id travels in the `Nats-Msg-Id` header, which JetStream also uses to drop
//! copies published within the stream's duplicate window; the inbox drops the rest.

mod consumer;
mod errors;
mod pending;
mod publisher;

pub use consumer::NatsConsumer;
pub use pending::NatsPending;
pub use publisher::NatsPublisher;

/// The header holding the message id.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";
