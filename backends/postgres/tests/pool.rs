//! The pool's acquire timeout against the real server (the sqlx backends' shared tests,
//! `../../sql/tests/clauses/pool.rs`), group commit off so each call holds one connection.

mod common;

use dedup_postgres::{DESCRIPTOR, PostgresConfig, PostgresStore, PostgresTarget};

type Store = PostgresStore;
type Target = PostgresTarget;

/// The test schema, and group commit off.
const URL_PARAMS: &str = "schema=dedup_test&group_commit=off&";

/// Group commit off: each call runs its own statement on one connection.
fn one_at_a_time(config: PostgresConfig) -> PostgresConfig {
    PostgresConfig {
        group_commit: None,
        ..config
    }
}

#[path = "../../sql/tests/clauses/pool.rs"]
mod shared;
