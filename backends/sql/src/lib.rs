#![doc = include_str!("../README.md")]

pub mod admin;
pub mod capabilities;
pub mod config;
pub mod connect;
pub mod counts;
pub mod error;
pub mod fresh;
pub mod migrate;
pub mod outbox;
pub mod purge;
pub mod purge_run;
pub mod query;
pub mod store;
pub mod target;
pub mod tx_inbox;
pub mod url_params;

pub use config::{SqlConfig, SqlSettings};
pub use error::SqlBackend;
pub use query::SqlDb;
pub use store::SqlStore;
pub use tx_inbox::{TxInbox, TxStore};
