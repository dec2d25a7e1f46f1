#![doc = include_str!("../README.md")]

mod admin;
mod blocking;
mod config;
mod connect;
mod counts;
mod decode;
mod error;
mod outbox;
mod outbox_schema;
mod outbox_statements;
mod outbox_table;
mod purge;
mod schema;
mod statements;
mod store;
mod tx;
mod tx_inbox;
mod url;
mod writes;

pub use config::{
    DEFAULT_TABLE, PURGE_RUNS_TABLE, SCHEMA_VERSIONS_TABLE, SqliteConfig, Synchronous,
};
pub use outbox::SqliteOutbox;
pub use store::SqliteStore;
pub use tx_inbox::TxInbox;
pub use url::{DESCRIPTOR, SqliteTarget};

/// The rusqlite this crate is built against, for the caller's transactions
/// ([`SqliteStore::claim_in_tx`] takes a `rusqlite::Transaction`).
pub use rusqlite;
