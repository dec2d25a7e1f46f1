#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod open;
mod registry;
mod store_url;

// The root names what a consumer writes; `tests/root.rs` pins the list (at most 40).
// Everything else is in a module below.
pub use dedup_core::admin::Admin;
pub use dedup_core::{
    BoxError, Claim, DedupStore, Error, Handled, Inbox, InboxConfig, InboxError, Key, Lease,
    MemoryStore, Purger, Record, Result, Timestamp, Transient,
};
pub use error::OpenError;
pub use open::{open, open_admin, open_outbox, open_with_clock};
pub use registry::register;
pub use store_url::StoreUrl;
pub use url::UrlError;

// The modules: each holds every item of its kind, the root's included.
pub use dedup_core::{admin, backend, health, layers, outbox, trace};
pub mod inbox;
pub mod purge;
pub mod store;
pub mod url;

/// The SQLite backend (`dedup-sqlite`), with the `sqlite` feature (on by default).
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use dedup_sqlite as sqlite;

/// The PostgreSQL backend (`dedup-postgres`), with the `postgres` feature.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use dedup_postgres as postgres;

/// The MySQL / MariaDB backend (`dedup-mysql`), with the `mysql` feature.
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use dedup_mysql as mysql;

/// The NATS JetStream key-value backend (`dedup-nats-kv`), with the `nats-kv` feature.
#[cfg(feature = "nats-kv")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats-kv")))]
pub use dedup_nats_kv as nats_kv;

/// The Redis backend (`dedup-redis`), with the `redis` feature.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use dedup_redis as redis;
