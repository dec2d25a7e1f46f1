//! Several purgers and many claimers at once on 200 000 records (four handles, each its
//! own pool): no deadlock, each record removed once, no live lease removed.
//!
//! The same on every sqlx backend: each backend's `tests/purgers.rs` includes this file
//! (`#[path]`) beside its `common` helpers. Not a test target of its own.

use std::sync::Arc;

use super::common;

use dedup_conformance::purgers::{Purging, purgers_and_claimers_at_once};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_purgers_and_claimers_on_200_000_records() {
    let url = crate::url_or_skip!();
    let clock = common::manual_clock();
    let table = common::unique_table("purgers");
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(Arc::new(
            common::store_on(&url, &table, Some(clock.clone())).await,
        ));
    }
    let figures = purgers_and_claimers_at_once(stores, clock, &Purging::default()).await;
    println!("{figures:#?}");
}
