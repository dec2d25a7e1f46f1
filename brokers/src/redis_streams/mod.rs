//! Redis Streams (redis-rs): [`StreamPublisher`] and [`StreamConsumer`].
//!
//! An entry is `message_id <id> payload <bytes>` plus one field per header. Dead letters go
//! to the stream `<stream>:dead` (see [`dead_stream`]); [`StreamDeadLetters`] reads them back
//! for a replay.

mod backlog;
mod consumer;
mod dead_letters;
mod errors;
mod pending;
mod publisher;

pub use backlog::StreamBacklog;
pub use consumer::StreamConsumer;
pub use dead_letters::StreamDeadLetters;
pub use pending::StreamPending;
pub use publisher::StreamPublisher;

/// The entry field holding the message id.
pub const MESSAGE_ID_FIELD: &str = "message_id";
/// The entry field holding the payload.
pub const PAYLOAD_FIELD: &str = "payload";
/// The field of a dead letter holding the id of the entry it copies.
pub const DEAD_ENTRY_ID_FIELD: &str = "x-dedup-entry-id";

/// The stream dead letters of `stream` go to: `<stream>:dead`.
pub fn dead_stream(stream: &str) -> String {
    format!("{stream}:dead")
}
