//! Several purgers and many claimers at once on 200 000 records (four handles) on the
//! standalone Redis and Valkey: no deadlock, each record removed once, no live lease removed.
//! (The clusters run the conformance suite's 8-purger clause; 200 000 keys spread over
//! three local nodes would add minutes of CI time for the same code path.)

mod common;

use std::sync::Arc;

use common::{Target, config};
use dedup_conformance::purgers::{Purging, purgers_and_claimers_at_once};
use dedup_core::ManualClock;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_purgers_and_claimers_on_200_000_records() {
    for target in Target::standalones("concurrent_purgers_and_claimers_on_200_000_records") {
        let clock = Arc::new(ManualClock::starting_now());
        let config = config("purgers", &clock);
        let mut stores = Vec::new();
        for _ in 0..4 {
            stores.push(Arc::new(target.open(config.clone()).await));
        }
        let figures = purgers_and_claimers_at_once(stores, clock, &Purging::default()).await;
        println!("{}: {figures:#?}", target.name());
    }
}
