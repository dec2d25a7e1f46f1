//! Several purgers and many claimers at once on 200 000 records in one SQLite file (two
//! handles): no deadlock, each record removed once, no live lease removed.

use std::sync::Arc;

use dedup_conformance::purgers::{Purging, purgers_and_claimers_at_once};
use dedup_core::ManualClock;
use dedup_sqlite::{SqliteConfig, SqliteStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_purgers_and_claimers_on_200_000_records() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("purgers.db");
    let clock = Arc::new(ManualClock::starting_now());
    let mut stores = Vec::new();
    for _ in 0..2 {
        let config = SqliteConfig {
            clock: Some(clock.clone()),
            ..SqliteConfig::default()
        };
        stores.push(Arc::new(
            SqliteStore::open_with(&path, config).await.expect("open"),
        ));
    }
    let figures = purgers_and_claimers_at_once(stores, clock, &Purging::default()).await;
    println!("{figures:#?}");
}
