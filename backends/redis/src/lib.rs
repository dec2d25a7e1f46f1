#![doc = include_str!("../README.md")]

mod admin;
mod config;
mod conn;
mod connect;
mod decode;
mod error;
mod held;
mod nodes;
mod pipeline;
mod primaries;
mod purge;
mod schema;
mod scripts;
mod store;
mod token;
mod url;

pub use config::{MAX_RETENTION, RedisConfig};
pub use error::ReplicationShortfall;
pub use store::RedisStore;
pub use url::{DESCRIPTOR, RedisTarget, cluster_url};

/// The redis-rs version this crate is built on, for connection types and errors.
pub use redis;
