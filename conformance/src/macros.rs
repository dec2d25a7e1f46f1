//! `suite!`, `transactional_suite!`, `tx_inbox_suite!` and `admin_suite!`: one `#[tokio::test]` per clause.
//!
//! The clause lists live once, in `__lease_clause_names!` / `__transactional_clause_names!`,
//! which hand them to `__clauses!`: as tests (`suite!`), or as a list of [`Clause`]s
//! ([`lease_clauses`](crate::clauses::lease_clauses), for running clauses by hand).
//!
//! [`Clause`]: crate::clauses::Clause

/// Expands to one `#[tokio::test]` per lease-mode clause (and the model-based test), each
/// calling the clause with the factory expression. The calling crate needs `tokio` (with the
/// `macros` and `rt-multi-thread` features) as a dev-dependency.
///
/// ```ignore
/// dedup_conformance::suite!(MyFactory::new());
/// ```
#[macro_export]
macro_rules! suite {
    ($factory:expr) => {
        $crate::__lease_clause_names!(tests $factory);
    };
}

/// Expands to one `#[tokio::test]` per transactional clause, for factories implementing
/// [`TransactionalFactory`](crate::TransactionalFactory).
#[macro_export]
macro_rules! transactional_suite {
    ($factory:expr) => {
        $crate::__transactional_clause_names!(tests $factory);
    };
}

/// Expands to one `#[tokio::test]` per clause of the transactional inbox (`TxInbox`), for
/// factories implementing [`TxInboxFactory`](crate::TxInboxFactory).
#[macro_export]
macro_rules! tx_inbox_suite {
    ($factory:expr) => {
        $crate::__tx_inbox_clause_names!(tests $factory);
    };
}

/// The clauses of the transactional inbox, handed to `__clauses!` with the caller's
/// arguments.
#[doc(hidden)]
#[macro_export]
macro_rules! __tx_inbox_clause_names {
    ($($args:tt)*) => {
        $crate::__clauses! { $($args)*;
            tx_inbox_runs_a_key_once_and_a_duplicate_gets_the_stored_outcome,
            tx_inbox_rollback_leaves_no_business_row_and_no_completion,
            tx_inbox_attempts_count_across_rollbacks_and_killed_workers,
            tx_inbox_dead_letters_a_key_past_max_attempts,
            tx_inbox_retries_a_transaction_the_database_refused_and_commits_once,
            tx_inbox_stores_a_failure_and_replays_it,
        }
    };
}

/// Expands to one `#[tokio::test]` per outbox clause, for factories implementing
/// [`OutboxFactory`](crate::outbox::OutboxFactory).
///
/// ```ignore
/// dedup_conformance::outbox_suite!(MyOutboxFactory::new());
/// ```
#[macro_export]
macro_rules! outbox_suite {
    ($factory:expr) => {
        $crate::__outbox_clause_names!(outbox_tests $factory);
    };
}

/// The outbox clauses, handed to `__clauses!` with the caller's arguments.
#[doc(hidden)]
#[macro_export]
macro_rules! __outbox_clause_names {
    ($($args:tt)*) => {
        $crate::__clauses! { $($args)*;
            outbox_publishes_every_committed_row,
            outbox_never_publishes_a_rolled_back_row,
            outbox_republishes_with_the_same_id_after_a_relay_died_before_its_mark,
            outbox_two_relays_never_hold_one_row,
            outbox_racing_relays_never_hold_two_rows_of_one_key,
            outbox_a_failing_row_dies_after_the_limit_and_later_rows_are_published,
            outbox_keeps_order_per_ordering_key,
            outbox_does_not_skip_a_row_that_committed_late,
            outbox_purges_sent_rows_after_retention_only,
            outbox_keeps_a_message_id_enqueued_twice_once,
            outbox_refuses_bad_input_and_writes_nothing,
            outbox_a_relay_whose_hold_was_taken_over_changes_nothing,
            outbox_hand_back_makes_rows_due_without_counting_the_attempt,
            outbox_retry_makes_a_dead_row_pending_again,
            outbox_delayed_rows_wait_until_due,
            outbox_stats_and_list_agree_with_the_rows,
            outbox_stats_by_destination_add_up_to_the_stats,
        }
    };
}

/// Expands to one `#[tokio::test]` per clause of the operator's extension
/// ([`Admin`](dedup_core::Admin)), for factories whose store implements it.
///
/// ```ignore
/// dedup_conformance::admin_suite!(MyFactory::new());
/// ```
#[macro_export]
macro_rules! admin_suite {
    ($factory:expr) => {
        $crate::__admin_clause_names!(tests $factory);
    };
}

/// The clauses of the operator's extension, handed to `__clauses!` with the caller's
/// arguments.
#[doc(hidden)]
#[macro_export]
macro_rules! __admin_clause_names {
    ($($args:tt)*) => {
        $crate::__clauses! { $($args)*;
            listing_never_shows_another_consumers_records,
            list_filters_by_status_and_pages_in_message_id_order,
            counts_equal_what_get_sees,
            operator_release_then_reclaim_gives_the_next_fence_and_the_old_lease_is_lost,
            operator_release_of_a_live_lease_needs_force,
            operator_release_revokes_the_holder_at_once,
            count_purgeable_equals_what_purge_removes,
            a_finished_purge_is_kept_as_the_last_run,
            forget_removes_a_completed_or_expired_record_and_the_key_starts_over,
            forget_of_a_live_lease_without_force_changes_nothing,
            forget_with_force_removes_a_live_lease_and_its_holder_loses_it,
            forget_of_an_absent_key_is_not_found,
            completed_records_are_processed_failed_or_dead_lettered,
        }
    };
}

/// The lease-mode clauses, in suite order, handed to `__clauses!` with the caller's arguments.
#[doc(hidden)]
#[macro_export]
macro_rules! __lease_clause_names {
    ($($args:tt)*) => {
        $crate::__clauses! { $($args)*;
            // claim
            first_claim_acquires,
            live_lease_gives_in_flight,
            expired_lease_is_taken_over,
            consumers_are_isolated,
            keys_are_distinct_byte_for_byte,
            keys_at_the_size_limits_round_trip,
            get_reports_the_record_faithfully,
            // commit
            commit_completes_the_key,
            commit_is_retry_safe_for_the_same_lease,
            an_expired_lease_not_taken_over_can_commit,
            stale_commit_after_takeover_is_rejected,
            commit_with_an_unknown_token_is_rejected,
            // release / renew
            release_lets_the_next_claim_acquire_at_once,
            release_keeps_the_fence_growing,
            release_is_idempotent,
            stale_release_after_takeover_is_rejected,
            stale_renew_after_takeover_is_rejected,
            renew_extends_the_lease,
            an_expired_lease_not_taken_over_can_be_renewed,
            renew_and_release_after_commit_are_rejected,
            // failures kept on the record
            a_released_failure_is_kept_on_the_record_until_replaced,
            an_oversized_or_stale_release_failed_writes_nothing,
            // fingerprint / outcome
            completed_key_gives_its_outcome_byte_for_byte,
            fingerprint_mismatch_is_an_error_in_every_state,
            a_takeover_stores_the_claims_fingerprint_or_keeps_the_stored_one,
            fingerprints_round_trip_exactly,
            // purge
            purge_removes_only_what_is_past_retention,
            purge_never_removes_a_live_lease,
            purge_works_in_batches_and_reports_counts,
            concurrent_purges_remove_each_record_once,
            a_purged_key_starts_afresh_and_its_old_lease_is_lost,
            a_default_purge_is_paced_and_removes_every_old_record,
            purgers_remove_old_records_once_and_keep_live_leases,
            // batch
            claim_many_equals_the_claims_in_order,
            commit_many_equals_the_commits_in_order,
            a_key_repeated_in_one_batch_behaves_as_in_order,
            empty_and_full_batches_are_accepted,
            // input validation
            invalid_lease_is_rejected_before_anything_is_written,
            oversized_outcome_is_rejected_and_the_lease_stays_in_flight,
            a_batch_with_one_invalid_item_writes_nothing,
            invalid_purge_options_are_rejected,
            unsafe_names_are_rejected,
            // hostile input (property-tested)
            hostile_input_is_a_typed_error_or_round_trips,
            hostile_names_are_rejected_or_work,
            // concurrency
            concurrent_claims_of_one_key_acquire_exactly_once,
            concurrent_takeovers_acquire_exactly_once,
            redelivered_keys_are_completed_exactly_once,
            concurrent_batches_acquire_each_key_once,
            a_commit_racing_a_takeover_has_one_winner,
            // persistence
            a_committed_record_survives_reopening_the_store,
            // model-based
            model_based_histories_match_memory_store,
        }
    };
}

/// The transactional clauses, in suite order, handed to `__clauses!` with the caller's arguments.
#[doc(hidden)]
#[macro_export]
macro_rules! __transactional_clause_names {
    ($($args:tt)*) => {
        $crate::__clauses! { $($args)*;
            tx_claim_then_commit_completes_the_key_with_its_business_row,
            tx_rollback_leaves_no_record_and_no_business_row,
            tx_claim_of_a_completed_key_gives_completed_and_the_transaction_stays_usable,
            tx_claim_of_a_live_lease_gives_in_flight,
            tx_claim_takes_over_an_expired_lease,
            concurrent_tx_claims_of_one_key_write_one_business_row,
            a_tx_claim_waiting_on_a_rolled_back_one_claims,
            commit_in_transaction_writes_the_business_row_and_the_completion_together,
            commit_in_transaction_after_takeover_is_rejected_and_writes_nothing,
            rolled_back_commit_in_transaction_leaves_the_lease_in_flight,
            tx_fingerprint_mismatch_is_an_error_and_writes_nothing,
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __clauses {
    (tests $factory:expr; $($clause:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $clause() {
                let factory = $factory;
                if $crate::should_run(&factory, stringify!($clause)) {
                    $crate::clauses::$clause(&factory).await;
                }
            }
        )*
    };
    (outbox_tests $factory:expr; $($clause:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $clause() {
                let factory = $factory;
                if $crate::outbox::should_run_outbox(&factory, stringify!($clause)) {
                    $crate::clauses::$clause(&factory).await;
                }
            }
        )*
    };
    (names; $($clause:ident),* $(,)?) => {
        [$(stringify!($clause)),*]
    };
    (list; $($clause:ident),* $(,)?) => {
        vec![$(
            $crate::clauses::Clause {
                name: stringify!($clause),
                run: |factory| Box::pin($crate::clauses::$clause(factory)),
            }
        ),*]
    };
}
