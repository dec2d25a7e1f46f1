#![doc = include_str!("../README.md")]

mod admin;
mod clock;
mod config;
mod connect;
mod decode;
mod error;
mod held;
mod messages;
mod purge;
mod schema;
mod store;
mod url;

pub use config::{MAX_NAME_LEN, MAX_REPLICAS, MAX_RETENTION, NatsKvConfig};
pub use store::NatsKvStore;
pub use url::{DESCRIPTOR, NatsKvTarget, store_url};

/// The async-nats version this crate is built on, for its client and errors.
pub use async_nats;
