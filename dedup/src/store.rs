//! The store contract: [`DedupStore`], its requests and answers, its limits, its errors
//! and its clock.
//!
//! A consumer claims a [`Key`] and gets a [`Claim`]. A fresh claim holds a [`Lease`]; the
//! lease's commit stores the outcome in the key's [`Record`]. [`MemoryStore`] is the
//! in-process store. [`Verdict`] reads the inbox's stored failures and dead letters back.
//! Lease time comes from a [`Clock`].

pub use dedup_core::{
    BoxError, Capabilities, Claim, ClaimOptions, ClaimRequest, Clock, CommitRequest,
    DEAD_LETTER_PREFIX, DedupStore, Error, FAILED_PREFIX, Fingerprint, ItemResult, Key, Lease,
    LeaseToken, MAX_BATCH_LEN, MAX_FINGERPRINT_LEN, MAX_LEASE, MAX_OUTCOME_LEN, MIN_LEASE,
    ManualClock, MemoryStore, RESERVED_PREFIX, Record, RecordState, Result, SystemClock, TimedOut,
    Timestamp, TxClaim, Verdict, duration_millis, idempotency_key,
};
