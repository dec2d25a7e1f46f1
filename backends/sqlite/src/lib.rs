#![doc = include_str!("../README.md")]

mod admin;
mod config;
mod error;
mod pool;
mod purge;
mod queries;
mod row;
mod schema;
mod store;
mod tx;
mod writes;

pub use config::{DEFAULT_TABLE, SCHEMA_VERSIONS_TABLE, SqliteConfig, Synchronous};
pub use store::SqliteStore;

/// The rusqlite this crate is built against, for the caller's transactions
/// ([`SqliteStore::claim_in_tx`] takes a `rusqlite::Transaction`).
pub use rusqlite;
