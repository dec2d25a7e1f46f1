//! RabbitMQ (AMQP 0-9-1, lapin): [`RabbitPublisher`] and [`RabbitConsumer`].
//!
//! Destinations are `exchange` or `exchange/routing-key` (the first `/` splits; an empty
//! exchange is the default exchange, so `/orders` goes straight to queue `orders`).
//!
//! Some constructors take lapin's types (`ConnectionProperties`, `Channel`). To name them,
//! depend on lapin as this crate does:
//! `lapin = { version = "4", default-features = false, features = ["tokio"] }`. Its default
//! features add rustls with aws-lc-rs: a C build this crate does not make.

mod backlog;
mod consumer;
mod dead_letters;
mod errors;
mod pending;
mod publisher;
mod topology;

pub use backlog::RabbitDepth;
pub use consumer::RabbitConsumer;
pub use dead_letters::RabbitDeadLetters;
pub use pending::{DeadLetters, RabbitPending};
pub use publisher::RabbitPublisher;
pub use topology::{DEAD_LETTER_EXCHANGE_ARG, Topology};

/// The header a copy dead-lettered by publishing ([`DeadLetters::Publish`]) carries: where
/// the original was published, as a destination (`exchange/routing-key`).
pub const ORIGIN_HEADER: &str = "x-dedup-origin";

/// `exchange` or `exchange/routing-key` into its two parts.
pub fn split_destination(destination: &str) -> (&str, &str) {
    destination.split_once('/').unwrap_or((destination, ""))
}
