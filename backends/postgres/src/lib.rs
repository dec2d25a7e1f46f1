#![doc = include_str!("../README.md")]

mod admin;
mod config;
mod connect;
mod counts;
mod ddl;
mod decode;
mod error;
mod group;
mod outbox;
mod outbox_schema;
mod outbox_statements;
mod outbox_table;
mod purge;
mod ring;
mod rounds;
mod schema;
mod statements;
mod store;
mod tx;
mod tx_inbox;
mod url;

pub use config::{GroupCommit, PostgresConfig};
pub use connect::{PING_IF_IDLE_FOR, pool_options};
pub use ddl::VERSIONS_TABLE as SCHEMA_VERSIONS_TABLE;
pub use dedup_sql::config::{PURGE_RUNS_TABLE, SqlConfig, SqlSettings};
pub use outbox::{PostgresOutbox, PostgresOutboxDialect};
pub use outbox_table::NOTIFY_EVERY;
pub use ring::{MAX_PARTITIONS, Partitions};
pub use sqlx;
pub use store::PostgresStore;
pub use tx_inbox::TxInbox;
pub use url::{DESCRIPTOR, PostgresTarget};
