//! Kept counts (`Admin::enable_counts`) the same on every sqlx backend: the mixed
//! workload's counts equal a scan's, and every admin clause holds on stores that keep
//! counts from their first write.
//!
//! Each backend's `tests/kept_counts.rs` includes this file (`#[path]`) beside its `common`
//! helpers and the alias `Store`. Not a test target of its own.

use async_trait::async_trait;
use dedup_conformance::clauses::{self, KeptCounts};
use dedup_conformance::{StoreFactory, TestContext, should_run};

use super::{Store, common};

/// One table per clause, on the clause's clock.
pub struct Factory;

#[async_trait]
impl StoreFactory for Factory {
    type Store = Store;

    async fn open(&self, ctx: &TestContext) -> Store {
        let url = common::url().expect("available() checked the URL");
        common::store_on(&url, &ctx.namespace, Some(ctx.clock.clone())).await
    }

    fn available(&self) -> bool {
        common::url().is_some()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kept_counts_equal_a_scan_through_a_mixed_workload() {
    if should_run(
        &Factory,
        "kept_counts_equal_a_scan_through_a_mixed_workload",
    ) {
        clauses::kept_counts_equal_a_scan_through_a_mixed_workload(&Factory).await;
    }
}

/// The admin clauses again, on stores that keep counts from their first write.
mod with_counts_kept {
    use super::*;
    dedup_conformance::admin_suite!(KeptCounts(Factory));
}
