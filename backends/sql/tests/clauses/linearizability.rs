//! Recorded concurrent histories of the store (four handles, each its own pool, on the
//! server's clock with real expiry) are linearizable.
//!
//! The same on every sqlx backend: each backend's `tests/linearizability.rs` includes this file
//! (`#[path]`) beside its `common` helpers. Not a test target of its own.

use std::sync::Arc;

use super::common;

use dedup_conformance::linearizability::{Workload, assert_linearizable};
use dedup_core::SystemClock;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn linearizable_histories() {
    let url = crate::url_or_skip!();
    let table = common::unique_table("linearizable");
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(Arc::new(common::store_on(&url, &table, None).await));
    }
    // The server reads the same wall clock as this process (loopback, one machine).
    assert_linearizable(stores, Arc::new(SystemClock), &Workload::default()).await;
}
