//! The pool's acquire timeout against the real server (the sqlx backends' shared tests,
//! `../../sql/tests/clauses/pool.rs`).

mod common;

use dedup_mysql::{DESCRIPTOR, MySqlConfig, MySqlStore, MySqlTarget};

type Store = MySqlStore;
type Target = MySqlTarget;

/// No URL parameters beside the table's and the pool's.
const URL_PARAMS: &str = "";

/// Every MySQL call runs its own statements already.
fn one_at_a_time(config: MySqlConfig) -> MySqlConfig {
    config
}

#[path = "../../sql/tests/clauses/pool.rs"]
mod shared;
