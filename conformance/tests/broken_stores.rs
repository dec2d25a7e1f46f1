//! Proof that the suite can fail: every clause runs against stores with one deliberate
//! fault each, and each fault must be caught by the clause named for it (the test prints
//! every clause that caught it). The same store without a fault passes every clause, so
//! each failure is the fault's doing.

mod common;

use std::panic::AssertUnwindSafe;

use common::{FakeTxFactory, Fault, FaultyFactory, TxInboxBreak};
use dedup_conformance::clauses::{Clause, lease_clauses, transactional_clauses, tx_inbox_clauses};
use dedup_conformance::model::{check_histories, model_config};
use futures::FutureExt;

const MODEL: &str = "model_based_histories_match_memory_store";

/// Every lease-mode clause, the model-based one limited to 64 histories (each fault it
/// can see shows up in far fewer; the check-then-act faults' 2 ms windows make histories
/// slow).
fn clauses() -> Vec<Clause<FaultyFactory>> {
    lease_clauses()
        .into_iter()
        .map(|clause| match clause.name {
            MODEL => Clause {
                name: MODEL,
                run: |factory| {
                    let config = proptest::test_runner::Config {
                        cases: 64,
                        ..model_config()
                    };
                    Box::pin(check_histories(factory, config))
                },
            },
            _ => clause,
        })
        .collect()
}

/// The names of the clauses in `clauses` that fail (panic) against `factory`.
async fn failing<F>(factory: &F, clauses: Vec<Clause<F>>) -> Vec<&'static str> {
    let mut failed = Vec::new();
    for clause in clauses {
        if AssertUnwindSafe((clause.run)(factory))
            .catch_unwind()
            .await
            .is_err()
        {
            failed.push(clause.name);
        }
    }
    failed
}

/// Run every lease-mode clause against `fault` and require `expected` among the failures.
async fn caught(fault: Fault, expected: &str) {
    let failed = failing(&FaultyFactory::new(fault), clauses()).await;
    println!(
        "{fault:?} is caught by {} clauses: {failed:#?}",
        failed.len()
    );
    assert!(
        failed.contains(&expected),
        "{fault:?} must be caught by {expected}; caught by {failed:?}"
    );
}

macro_rules! broken_store_tests {
    ($($test:ident: $fault:ident => $clause:ident,)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $test() {
            caught(Fault::$fault, stringify!($clause)).await;
        }
    )*};
}

broken_store_tests! {
    check_then_act_claim_is_caught: CheckThenActClaim
        => concurrent_claims_of_one_key_acquire_exactly_once,
    check_then_act_commit_is_caught: CheckThenActCommit
        => a_commit_racing_a_takeover_has_one_winner,
    commit_without_token_check_is_caught: CommitWithoutTokenCheck
        => stale_commit_after_takeover_is_rejected,
    release_that_deletes_the_record_is_caught: ReleaseDeletesRecord
        => release_keeps_the_fence_growing,
    purge_of_live_leases_is_caught: PurgeRemovesLiveLeases
        => purge_never_removes_a_live_lease,
    purge_ignoring_batch_size_is_caught: PurgeIgnoresBatchSize
        => purge_works_in_batches_and_reports_counts,
    ignored_fingerprint_is_caught: FingerprintIgnored
        => fingerprint_mismatch_is_an_error_in_every_state,
    batch_skipping_duplicates_is_caught: BatchSkipsDuplicates
        => a_key_repeated_in_one_batch_behaves_as_in_order,
    batch_validating_lazily_is_caught: BatchValidatesLazily
        => a_batch_with_one_invalid_item_writes_nothing,
    takeover_keeping_the_fence_is_caught: TakeoverKeepsFence
        => expired_lease_is_taken_over,
    lease_live_at_its_expiry_is_caught: LiveAtExpiry
        => expired_lease_is_taken_over,
    empty_outcome_stored_as_none_is_caught: EmptyOutcomeStoredAsNone
        => completed_key_gives_its_outcome_byte_for_byte,
    retried_commit_overwriting_is_caught: RetryCommitOverwrites
        => commit_is_retry_safe_for_the_same_lease,
    consumers_sharing_records_is_caught: ConsumerIgnored
        => consumers_are_isolated,
    renew_from_the_old_expiry_is_caught: RenewFromOldExpiry
        => renew_extends_the_lease,
    unchecked_names_are_caught: NamesUnchecked
        => unsafe_names_are_rejected,
    a_release_that_drops_the_cause_is_caught: ReleaseFailedDropsCause
        => a_released_failure_is_kept_on_the_record_until_replaced,
}

/// The model-based clause on its own catches every fault a single sequential history can
/// show (all but the check-then-act races, which need concurrency).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_model_based_clause_catches_every_sequential_fault() {
    let sequential = [
        Fault::CommitWithoutTokenCheck,
        Fault::ReleaseDeletesRecord,
        Fault::PurgeRemovesLiveLeases,
        Fault::PurgeIgnoresBatchSize,
        Fault::FingerprintIgnored,
        Fault::BatchSkipsDuplicates,
        Fault::TakeoverKeepsFence,
        Fault::LiveAtExpiry,
        Fault::EmptyOutcomeStoredAsNone,
        Fault::RetryCommitOverwrites,
        Fault::ConsumerIgnored,
        Fault::RenewFromOldExpiry,
    ];
    let mut missed = Vec::new();
    for fault in sequential {
        let model = clauses().into_iter().filter(|c| c.name == MODEL).collect();
        if failing(&FaultyFactory::new(fault), model).await.is_empty() {
            missed.push(fault);
        }
    }
    assert!(
        missed.is_empty(),
        "the model-based clause missed {missed:?}"
    );
}

/// Without a fault the same store passes every lease-mode clause.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_store_without_a_fault_passes_every_clause() {
    let failed = failing(&FaultyFactory::new(Fault::None), lease_clauses()).await;
    assert!(failed.is_empty(), "a correct store failed {failed:?}");
}

/// A transactional extension that ignores the transaction (writes at once, keeps them on
/// rollback, never makes a second transaction wait) is caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactional_clauses_catch_an_extension_that_ignores_the_transaction() {
    let failed = failing(
        &FakeTxFactory::ignoring_the_transaction(),
        transactional_clauses(),
    )
    .await;
    println!("ignoring the transaction is caught by: {failed:#?}");
    for expected in [
        "tx_rollback_leaves_no_record_and_no_business_row",
        "concurrent_tx_claims_of_one_key_write_one_business_row",
        "rolled_back_commit_in_transaction_leaves_the_lease_in_flight",
    ] {
        assert!(
            failed.contains(&expected),
            "{expected} missed it: {failed:?}"
        );
    }
}

/// The correct in-memory imitation of the transactional extension passes every
/// transactional clause (one test per clause).
mod correct_transactional_extension {
    dedup_conformance::transactional_suite!(super::FakeTxFactory::correct());
}

/// Run every transactional-inbox clause against an inbox broken as `how` and require
/// `expected` among the failures.
async fn tx_inbox_caught(how: TxInboxBreak, expected: &str) {
    let failed = failing(
        &FakeTxFactory::breaking_the_tx_inbox(how),
        tx_inbox_clauses(),
    )
    .await;
    println!("{how:?} is caught by {failed:#?}");
    assert!(
        failed.contains(&expected),
        "{how:?} must be caught by {expected}; caught by {failed:?}"
    );
}

macro_rules! broken_tx_inbox_tests {
    ($($test:ident: $how:ident => $clause:ident,)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $test() {
            tx_inbox_caught(TxInboxBreak::$how, stringify!($clause)).await;
        }
    )*};
}

broken_tx_inbox_tests! {
    tx_inbox_running_duplicates_is_caught: RunsDuplicates
        => tx_inbox_runs_a_key_once_and_a_duplicate_gets_the_stored_outcome,
    tx_inbox_keeping_rolled_back_rows_is_caught: KeepsRolledBackRows
        => tx_inbox_rollback_leaves_no_business_row_and_no_completion,
    tx_inbox_forgetting_attempts_is_caught: ForgetsAttempts
        => tx_inbox_attempts_count_across_rollbacks_and_killed_workers,
    tx_inbox_forgetting_attempts_misses_the_dead_letter: ForgetsAttempts
        => tx_inbox_dead_letters_a_key_past_max_attempts,
    tx_inbox_ignoring_max_attempts_is_caught: IgnoresMaxAttempts
        => tx_inbox_dead_letters_a_key_past_max_attempts,
    tx_inbox_without_retries_is_caught: NoRetry
        => tx_inbox_retries_a_transaction_the_database_refused_and_commits_once,
    tx_inbox_counting_conflicts_as_attempts_is_caught: CountsConflicts
        => tx_inbox_retries_a_transaction_the_database_refused_and_commits_once,
    tx_inbox_not_storing_failures_is_caught: NoStoredFailure
        => tx_inbox_stores_a_failure_and_replays_it,
}

/// The correct fake transactional inbox passes every transactional-inbox clause.
mod correct_tx_inbox {
    dedup_conformance::tx_inbox_suite!(super::FakeTxFactory::correct());
}
