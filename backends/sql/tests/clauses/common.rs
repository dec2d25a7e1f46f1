//! Test helpers the same on every sqlx backend: each backend's `tests/common/mod.rs`
//! includes this file as a module (`#[path]`) and re-exports it, beside what is its own
//! (`URL_VAR`, the aliases `Store` and `Config`, `config`, the business table's SQL). Not a
//! test target of its own (cargo builds `tests/*.rs` only).

use std::sync::Arc;

use dedup_core::{Clock, ManualClock};

use super::{Store, URL_VAR, config};

/// The server URL (`URL_VAR`), or `None` to skip (a failure under `DEDUP_TEST_STRICT=1`).
pub fn url() -> Option<String> {
    dedup_conformance::server_url(URL_VAR)
}

/// Skip the calling test (returning early) when no server is configured.
#[macro_export]
macro_rules! url_or_skip {
    () => {
        match common::url() {
            Some(url) => url,
            None => {
                eprintln!(
                    "SKIPPED: {} is not set (see scripts/test.sh)",
                    common::URL_VAR
                );
                return;
            }
        }
    };
}

/// A unique table name for `test`.
pub fn unique_table(test: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("t_{}_{}", &test[..test.len().min(20)], &id[..16])
}

/// A migrated store on a fresh table, on `clock` (`None`: the server's clock).
pub async fn store(url: &str, test: &str, clock: Option<Arc<dyn Clock>>) -> Store {
    store_on(url, &unique_table(test), clock).await
}

/// A migrated store on `table` (a second call gives an independent handle, own pool).
pub async fn store_on(url: &str, table: &str, clock: Option<Arc<dyn Clock>>) -> Store {
    let mut config = config(table);
    config.clock = clock;
    config.max_connections = 8;
    Store::connect_with(url, config)
        .await
        .expect("connect and migrate")
}

/// A manual clock standing at the current time.
pub fn manual_clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::starting_now())
}
