//! The shared helpers of `tests/common`, with every store on the partitioned layout.
#![allow(dead_code)] // each test uses a different part

use std::time::Duration;

use dedup_postgres::{Partitions, PostgresConfig, PostgresStore, SqlSettings};

pub use super::PARTITIONS;

/// The schema every test table lives in (created by the first migrate).
pub const SCHEMA: &str = "dedup_test";

/// The variable naming the server's URL.
pub const URL_VAR: &str = "DEDUP_POSTGRES_URL";

/// The store type the shared helpers open.
pub type Store = PostgresStore;

/// A partitioned configuration on `table` (the shared helpers set the clock and the pool).
pub fn config(table: &str) -> PostgresConfig {
    config_with(table, PARTITIONS)
}

/// A configuration on `table` with `partitions`.
pub fn config_with(table: &str, partitions: Partitions) -> PostgresConfig {
    PostgresConfig {
        schema: SCHEMA.into(),
        sql: SqlSettings {
            table: table.into(),
            ..Default::default()
        },
        partitions: Some(partitions),
        ..PostgresConfig::default()
    }
}

/// Windows of `ms` milliseconds, `count` partitions.
pub fn ring(ms: u64, count: u16) -> Partitions {
    Partitions {
        window: Duration::from_millis(ms),
        count,
    }
}

#[path = "../../../sql/tests/clauses/common.rs"]
mod shared;
pub use shared::*;

#[path = "../common/business.rs"]
mod business;
#[allow(unused_imports)] // each test binary uses a different part
pub use business::*;
