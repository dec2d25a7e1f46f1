//! Shared by the server-backed tests: the server URL, fresh stores and business tables.
#![allow(dead_code)] // each test binary uses a different part

use dedup_postgres::{PostgresConfig, PostgresStore, SqlSettings};

/// The schema every test table lives in (created by the first migrate).
pub const SCHEMA: &str = "dedup_test";

/// The variable naming the server's URL.
pub const URL_VAR: &str = "DEDUP_POSTGRES_URL";

/// The store type the shared helpers open.
pub type Store = PostgresStore;

/// A configuration on `table` (the shared helpers set the clock and the pool).
pub fn config(table: &str) -> PostgresConfig {
    PostgresConfig {
        schema: SCHEMA.into(),
        sql: SqlSettings {
            table: table.into(),
            ..Default::default()
        },
        ..PostgresConfig::default()
    }
}

#[path = "../../../sql/tests/clauses/common.rs"]
mod shared;
pub use shared::*;

mod business;
#[allow(unused_imports)] // each test binary uses a different part
pub use business::*;
