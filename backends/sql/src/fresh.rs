//! The common cases, run first: a claim of a key without a record is one plain insert, and
//! a commit by the lease's holder one update, each returning as little as it can. Anything
//! else (a key with a record, a lease no longer held) takes the backend's general path,
//! which reads the record and applies the contract.
//!
//! Both sqlx backends answer a fresh claim with the same lease; it is built here, once.

use dedup_core::{Claim, Key, Lease, LeaseToken, Timestamp};

/// What a fast path found.
#[derive(Debug)]
pub enum Fast<T> {
    /// The common case: done, with this answer.
    Done(T),
    /// Not the common case: take the general path.
    General,
}

/// The claim of `key` that inserted a new record: the first acquisition, so fence 1 and
/// attempt 1, holding `token` until `expires_at` (the insert's "now" plus the lease).
pub fn acquired(key: &Key, token: LeaseToken, expires_at: Timestamp) -> Claim {
    Claim::Acquired(Lease {
        key: key.clone(),
        token,
        fence: 1,
        attempt: 1,
        expires_at,
    })
}
