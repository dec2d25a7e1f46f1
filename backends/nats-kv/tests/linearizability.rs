//! Recorded concurrent histories of `NatsKvStore` on an R3 bucket of the 3-node cluster
//! (four handles, each its own connection to a node of its own choice, on the server's
//! clock with real expiry) are linearizable.
//!
//! The store's "now" is the stream leader's clock as sampled over a round trip (see the
//! crate docs, "Time"), so it may differ from this machine's by up to half that round trip.
//! The check allows [`CLOCK_SLACK`] for it instead of the default 2 ms; everything else is
//! checked as for every store.

mod common;

use std::sync::Arc;
use std::time::Duration;

use dedup_conformance::linearizability::{CheckOptions, Workload, check, record_workload};
use dedup_core::SystemClock;

/// How far the sampled server clock may be from this machine's during the run.
const CLOCK_SLACK: Duration = Duration::from_millis(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn linearizable_histories() {
    let Some(servers) = common::cluster() else {
        return;
    };
    let prefix = common::unique_prefix("lin");
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(Arc::new(common::store(&servers, &prefix, None).await));
    }
    let workload = Workload::default();
    // The server's clock: the stream leader's, on this machine's wall clock.
    let history = record_workload(stores, Arc::new(SystemClock), &workload).await;
    let options = CheckOptions {
        clock_slack: CLOCK_SLACK,
        ..CheckOptions::default()
    };
    let seed = workload.seed;
    let summary = check(&history, &options).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    println!("linearizable (seed {seed}): {summary:?}");
    assert!(summary.takeovers > 0, "no takeover by expiry (seed {seed})");
}
