#![doc = include_str!("../README.md")]

mod admin;
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
mod versions;

pub use config::MySqlConfig;
pub use config::VERSIONS_TABLE as SCHEMA_VERSIONS_TABLE;
pub use connect::{GaleraSyncWait, PING_IF_IDLE_FOR, pool_options};
pub use dedup_sql::config::{PURGE_RUNS_TABLE, SqlConfig, SqlSettings};
pub use outbox::{MySqlOutbox, MySqlOutboxDialect};
pub use sqlx;
pub use store::MySqlStore;
pub use tx_inbox::TxInbox;
pub use url::{DESCRIPTOR, MySqlTarget};
