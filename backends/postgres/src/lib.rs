#![doc = include_str!("../README.md")]

mod admin;
mod config;
mod connect;
mod error;
mod migrate;
mod purge;
mod record;
mod rounds;
mod sql;
mod store;
mod tx;

pub use config::PostgresConfig;
pub use connect::{PING_IF_IDLE_FOR, pool_options};
pub use sqlx;
pub use store::PostgresStore;
