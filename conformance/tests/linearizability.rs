//! The linearizability checker on `MemoryStore` (histories must be linearizable) and on
//! deliberately broken stores (their histories must be rejected): proof that the checker
//! can fail.

mod common;

use std::sync::Arc;

use common::{Fault, FaultyStore};
use dedup_conformance::linearizability::{
    CheckError, CheckOptions, Workload, assert_linearizable, check, record_workload,
};
use dedup_core::{Clock, MemoryStore, SystemClock};

fn wall_clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn linearizable_memory_store_histories() {
    let store = MemoryStore::new();
    assert_linearizable(vec![store], wall_clock(), &Workload::default()).await;
}

/// Record histories of a store with `fault` until one is rejected as not linearizable
/// (at most 5 runs); print the rejection.
async fn rejected(fault: Fault) {
    for run in 0..5 {
        let store = FaultyStore::new(fault, wall_clock());
        let workload = Workload::default();
        let history = record_workload(vec![store], wall_clock(), &workload).await;
        match check(&history, &CheckOptions::default()) {
            Err(e @ CheckError::NotLinearizable { .. }) => {
                println!(
                    "{fault:?} rejected on run {run} (seed {}):\n{e}",
                    workload.seed
                );
                return;
            }
            Err(other) => panic!("{fault:?}: expected NotLinearizable, got {other}"),
            Ok(summary) => println!("{fault:?}: run {run} passed unnoticed: {summary:?}"),
        }
    }
    panic!("{fault:?}: 5 histories were accepted as linearizable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn non_linearizable_check_then_act_claim_is_rejected() {
    rejected(Fault::CheckThenActClaim).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn non_linearizable_commit_without_token_check_is_rejected() {
    rejected(Fault::CommitWithoutTokenCheck).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn non_linearizable_release_deleting_the_record_is_rejected() {
    rejected(Fault::ReleaseDeletesRecord).await;
}

/// The correct store of the broken-store tests (no fault) passes, so the rejections above
/// are the faults' doing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn linearizable_faultless_store_histories() {
    let store = FaultyStore::new(Fault::None, wall_clock());
    assert_linearizable(vec![store], wall_clock(), &Workload::default()).await;
}
