#![doc = include_str!("../README.md")]

mod error;
mod open;
// Helpers of the backends a build leaves out are unused in it.
#[cfg_attr(
    not(all(
        feature = "sqlite",
        feature = "postgres",
        feature = "redis",
        feature = "mysql"
    )),
    allow(dead_code)
)]
mod params;
mod redact;
// Helpers of the backends a build leaves out are unused in it.
#[cfg_attr(
    not(all(
        feature = "sqlite",
        feature = "postgres",
        feature = "redis",
        feature = "mysql"
    )),
    allow(dead_code)
)]
mod url;

pub use dedup_core::*;
pub use error::{OpenError, UrlError};
pub use open::{open, open_admin, open_outbox, open_with_clock};
pub use redact::redact;
pub use url::{StoreTarget, StoreUrl, redis_cluster_url};

/// The SQLite backend (`dedup-sqlite`), with the `sqlite` feature (on by default).
#[cfg(feature = "sqlite")]
pub use dedup_sqlite as sqlite;
#[cfg(feature = "sqlite")]
pub use dedup_sqlite::{SqliteConfig, SqliteOutbox, SqliteStore, Synchronous};

/// The PostgreSQL backend (`dedup-postgres`), with the `postgres` feature.
#[cfg(feature = "postgres")]
pub use dedup_postgres as postgres;
#[cfg(feature = "postgres")]
pub use dedup_postgres::{PostgresConfig, PostgresOutbox, PostgresStore};

/// The MySQL / MariaDB backend (`dedup-mysql`), with the `mysql` feature.
#[cfg(feature = "mysql")]
pub use dedup_mysql as mysql;
#[cfg(feature = "mysql")]
pub use dedup_mysql::{MySqlConfig, MySqlStore};

/// The Redis backend (`dedup-redis`), with the `redis` feature.
#[cfg(feature = "redis")]
pub use dedup_redis as redis;
#[cfg(feature = "redis")]
pub use dedup_redis::{RedisConfig, RedisStore};
