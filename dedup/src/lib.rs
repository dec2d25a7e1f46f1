#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod open;
mod registry;
mod url;

pub use dedup_core::backend::url::{BackendDescriptor, StoreTarget, UrlError, redact};
pub use dedup_core::*;
pub use error::{OpenError, RegisterError};
pub use open::{open, open_admin, open_outbox, open_with_clock};
pub use registry::{backends, register};
pub use url::StoreUrl;

/// The SQLite backend (`dedup-sqlite`), with the `sqlite` feature (on by default).
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use dedup_sqlite as sqlite;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use dedup_sqlite::{SqliteConfig, SqliteOutbox, SqliteStore, Synchronous};

/// The PostgreSQL backend (`dedup-postgres`), with the `postgres` feature.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use dedup_postgres as postgres;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use dedup_postgres::{PostgresConfig, PostgresOutbox, PostgresStore};

/// The MySQL / MariaDB backend (`dedup-mysql`), with the `mysql` feature.
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use dedup_mysql as mysql;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use dedup_mysql::{MySqlConfig, MySqlOutbox, MySqlStore};

/// The Redis backend (`dedup-redis`), with the `redis` feature.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use dedup_redis as redis;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use dedup_redis::cluster_url as redis_cluster_url;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use dedup_redis::{RedisConfig, RedisStore};
