//! The input checks of every public entry point, in one place.
//!
//! The blanket [`DedupStore`](crate::DedupStore), [`Admin`](crate::Admin) and
//! [`OutboxStore`](crate::outbox::OutboxStore) implementations over
//! [`Storage`](super::Storage) and [`OutboxStorage`](super::OutboxStorage) call these
//! before any backend code runs, and so do the entry points that are not on a trait (the SQL backends'
//! `commit_in_tx`). A failed check is [`Error::InvalidInput`](crate::Error::InvalidInput)
//! and nothing has been written. [`Key`](crate::Key)s need no check here: one cannot be
//! built invalid.

use std::time::Duration;

use crate::admin::{ListFilter, validate_top};
use crate::outbox::{AfterFailure, MAX_DELAY};
use crate::types::{validate_batch_len, validate_lease, validate_outcome};
use crate::{ClaimOptions, ClaimRequest, CommitRequest, PurgeOptions, Result};

/// A claim's options: the lease duration within the limits.
pub fn claim(options: &ClaimOptions) -> Result<()> {
    options.validate()
}

/// A `claim_many`: the batch length, then every request, before anything is written.
pub fn claim_many(requests: &[ClaimRequest]) -> Result<()> {
    validate_batch_len(requests.len())?;
    requests.iter().try_for_each(|r| claim(&r.options))
}

/// `release_failed`: the failure fits [`MAX_FAILURE_LEN`](crate::MAX_FAILURE_LEN) (see
/// [`Failure::validate`](crate::Failure::validate)).
pub fn release_failed(failure: &crate::Failure) -> Result<()> {
    failure.validate()
}

/// A renewal's duration.
pub fn renew(extend_by: Duration) -> Result<()> {
    validate_lease(extend_by)
}

/// A commit's outcome (lease mode, and the SQL backends' `commit_in_tx`).
pub fn commit(outcome: Option<&[u8]>) -> Result<()> {
    validate_outcome(outcome)
}

/// A `commit_many`: the batch length, then every outcome, before anything is written.
pub fn commit_many(requests: &[CommitRequest]) -> Result<()> {
    validate_batch_len(requests.len())?;
    requests
        .iter()
        .try_for_each(|r| commit(r.outcome.as_deref()))
}

/// A purge's options.
pub fn purge(options: &PurgeOptions) -> Result<()> {
    options.validate()
}

/// An operator's listing filter: a valid consumer, a limit within bounds.
pub fn list(filter: &ListFilter) -> Result<()> {
    filter.validate()
}

/// How many most retried keys the stats may list.
pub fn stats(top: usize) -> Result<()> {
    validate_top(top)
}

/// Most rows one outbox take may ask for.
pub const MAX_OUTBOX_TAKE: usize = 10_000;

/// Most rows one outbox listing may return.
pub const MAX_OUTBOX_LIST: usize = 10_000;

/// An outbox take: 1 to [`MAX_OUTBOX_TAKE`] rows, a hold within the lease limits.
pub fn outbox_take(limit: usize, hold: Duration) -> Result<()> {
    if limit == 0 || limit > MAX_OUTBOX_TAKE {
        return Err(crate::Error::InvalidInput {
            what: "outbox take limit",
            reason: format!("{limit}: must be 1 to {MAX_OUTBOX_TAKE}"),
        });
    }
    validate_lease(hold)
}

/// The ids of an outbox mark or hand-back: at most [`MAX_OUTBOX_TAKE`] (a relay marks
/// only rows it took).
pub fn outbox_ids(ids: &[i64]) -> Result<()> {
    if ids.len() > MAX_OUTBOX_TAKE {
        return Err(crate::Error::InvalidInput {
            what: "outbox ids",
            reason: format!("{} ids: at most {MAX_OUTBOX_TAKE}", ids.len()),
        });
    }
    Ok(())
}

/// What a failed publish does to its row: a retry delay of at most
/// [`crate::outbox::MAX_DELAY`], as for a message's own delay.
pub fn outbox_after_failure(after: AfterFailure) -> Result<()> {
    match after {
        AfterFailure::RetryAfter(delay) if delay > MAX_DELAY => Err(crate::Error::InvalidInput {
            what: "outbox retry delay",
            reason: format!("{delay:?} is over the limit of {MAX_DELAY:?}"),
        }),
        AfterFailure::RetryAfter(_) | AfterFailure::Dead => Ok(()),
    }
}

/// An outbox listing's limit (0 means 100), at most [`MAX_OUTBOX_LIST`]; the limit to use.
pub fn outbox_list_limit(limit: usize) -> Result<usize> {
    match limit {
        0 => Ok(100),
        n if n <= MAX_OUTBOX_LIST => Ok(n),
        n => Err(crate::Error::InvalidInput {
            what: "outbox list limit",
            reason: format!("{n}: at most {MAX_OUTBOX_LIST}"),
        }),
    }
}
