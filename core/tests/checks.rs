//! The input checks every entry point runs first (`backend::check`), at their limits: the
//! largest value allowed passes and the next one is refused. Each test pins a rule a mutant
//! of `check.rs` broke while every other test still passed (see `MUTANTS.md`).

use std::time::Duration;

use dedup_core::backend::check;
use dedup_core::outbox::{AfterFailure, MAX_DELAY};
use dedup_core::{Error, MAX_LEASE};

fn refused<T: std::fmt::Debug>(result: dedup_core::Result<T>) -> bool {
    matches!(result, Err(Error::InvalidInput { .. }))
}

#[test]
fn an_outbox_take_asks_for_one_to_the_most_rows_with_a_valid_hold() {
    let hold = Duration::from_secs(30);
    assert!(check::outbox_take(1, hold).is_ok());
    assert!(check::outbox_take(check::MAX_OUTBOX_TAKE, hold).is_ok());
    assert!(refused(check::outbox_take(0, hold)));
    assert!(refused(check::outbox_take(
        check::MAX_OUTBOX_TAKE + 1,
        hold
    )));
    assert!(check::outbox_take(1, MAX_LEASE).is_ok());
    assert!(refused(check::outbox_take(1, Duration::ZERO)));
}

#[test]
fn an_outbox_mark_or_hand_back_names_at_most_as_many_ids_as_a_take_holds() {
    assert!(check::outbox_ids(&[]).is_ok());
    assert!(check::outbox_ids(&vec![1; check::MAX_OUTBOX_TAKE]).is_ok());
    assert!(refused(check::outbox_ids(&vec![
        1;
        check::MAX_OUTBOX_TAKE + 1
    ])));
}

#[test]
fn a_failed_publish_retries_after_at_most_the_longest_delay() {
    let after = |delay| check::outbox_after_failure(AfterFailure::RetryAfter(delay));
    assert!(after(Duration::ZERO).is_ok());
    assert!(after(MAX_DELAY).is_ok());
    assert!(refused(after(MAX_DELAY + Duration::from_millis(1))));
    assert!(check::outbox_after_failure(AfterFailure::Dead).is_ok());
}

#[test]
fn an_outbox_listing_limit_of_zero_means_a_hundred_and_the_most_is_allowed() {
    assert_eq!(check::outbox_list_limit(0).unwrap(), 100);
    assert_eq!(check::outbox_list_limit(7).unwrap(), 7);
    assert_eq!(
        check::outbox_list_limit(check::MAX_OUTBOX_LIST).unwrap(),
        check::MAX_OUTBOX_LIST
    );
    assert!(refused(check::outbox_list_limit(
        check::MAX_OUTBOX_LIST + 1
    )));
}
