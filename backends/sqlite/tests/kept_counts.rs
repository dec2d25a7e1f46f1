//! Kept counts (`Admin::enable_counts`) on SQLite: the mixed workload's counts equal a
//! scan's, and every admin clause holds with counts kept. (That disabling leaves the schema
//! as it was is a unit test of `counts.rs`.)

use async_trait::async_trait;
use dedup_conformance::clauses::{self, KeptCounts};
use dedup_conformance::{StoreFactory, TestContext, should_run};
use dedup_sqlite::{SqliteConfig, SqliteStore};

/// One table per clause in one database file, on the clause's clock.
struct Factory {
    dir: tempfile::TempDir,
}

impl Factory {
    fn new() -> Self {
        Factory {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }
}

#[async_trait]
impl StoreFactory for Factory {
    type Store = SqliteStore;

    async fn open(&self, ctx: &TestContext) -> SqliteStore {
        let config = SqliteConfig {
            table: ctx.namespace.clone(),
            clock: Some(ctx.clock.clone()),
            ..SqliteConfig::default()
        };
        SqliteStore::open_with(self.dir.path().join("kept.db"), config)
            .await
            .expect("open")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kept_counts_equal_a_scan_through_a_mixed_workload() {
    let factory = Factory::new();
    if should_run(
        &factory,
        "kept_counts_equal_a_scan_through_a_mixed_workload",
    ) {
        clauses::kept_counts_equal_a_scan_through_a_mixed_workload(&factory).await;
    }
}

/// The admin clauses again, on stores that keep counts from their first write.
mod with_counts_kept {
    use super::*;
    dedup_conformance::admin_suite!(KeptCounts(Factory::new()));
}
