#![doc = include_str!("../README.md")]

pub mod admin;
pub mod connect;
pub mod error;
pub mod migrate;
pub mod outbox;
pub mod purge;
pub mod tx_inbox;

pub use error::SqlBackend;
pub use tx_inbox::{TxInbox, TxStore};
