//! The input checks of every public entry point, in one place.
//!
//! The blanket [`DedupStore`](crate::DedupStore) and [`Admin`](crate::Admin)
//! implementations over [`Storage`](super::Storage) call these before any backend code
//! runs, and so do the entry points that are not on a trait (the SQL backends'
//! `commit_in_tx`). A failed check is [`Error::InvalidInput`](crate::Error::InvalidInput)
//! and nothing has been written. [`Key`](crate::Key)s need no check here: one cannot be
//! built invalid.

use std::time::Duration;

use crate::admin::{ListFilter, validate_top};
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
