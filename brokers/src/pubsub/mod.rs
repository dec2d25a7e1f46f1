//! Google Cloud Pub/Sub (gcloud-pubsub, gRPC): [`PubSubPublisher`] and [`PubSubConsumer`].
//!
//! The message id travels as the [`MESSAGE_ID_ATTRIBUTE`] attribute (`message-id`; Pub/Sub's
//! own `messageId` is assigned by the server on each publish, so a message published twice
//! has two); a destination is a topic id of the client's project. The client is
//! gcloud-pubsub's [`Client`](gcloud_pubsub::client::Client), re-exported as
//! [`gcloud_pubsub`] (with [`gcloud_gax`] for its statuses and retry settings and
//! [`gcloud_googleapis`] for its request and message types): its `ClientConfig::default()` talks to the emulator named by
//! `PUBSUB_EMULATOR_HOST` when that is set, else to Google Cloud (`with_auth()` for the
//! credentials). See the crate README for the consumer's choices.

mod consumer;
mod dead_letters;
mod errors;
mod pending;
mod publisher;

pub use consumer::PubSubConsumer;
pub use dead_letters::PubSubDeadLetters;
pub use pending::PubSubPending;
pub use publisher::PubSubPublisher;
pub use {gcloud_gax, gcloud_googleapis, gcloud_pubsub};

/// The attribute that carries a message's id (what the inbox keys on).
pub const MESSAGE_ID_ATTRIBUTE: &str = "message-id";

/// The attribute a dead-lettered copy carries: the subscription and Pub/Sub message id of
/// the message it copies (`subscription/message id`).
pub const ORIGIN_ATTRIBUTE: &str = "x-dedup-origin";
