//! Recorded concurrent histories of `SqliteStore` (two handles on one file, so two
//! connection pools, on the system clock with real expiry) are linearizable.

use std::sync::Arc;

use dedup_conformance::linearizability::{Workload, assert_linearizable};
use dedup_core::SystemClock;
use dedup_sqlite::{SqliteConfig, SqliteStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn linearizable_sqlite_histories() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("lin.db");
    let mut stores = Vec::new();
    for _ in 0..2 {
        let store = SqliteStore::open_with(&path, SqliteConfig::default())
            .await
            .expect("open");
        stores.push(Arc::new(store));
    }
    assert_linearizable(stores, Arc::new(SystemClock), &Workload::default()).await;
}
