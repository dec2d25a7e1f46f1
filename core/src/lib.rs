#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

// What consumers and operators use, in the order they meet it (see the README).
pub mod admin;
mod error;
mod failure;
pub mod health;
mod inbox;
mod key;
pub mod layers;
mod memory;
pub mod outbox;
mod purge_run;
mod purger;
mod store;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod test_util;
mod time;
mod tls;
pub mod trace;
mod types;
mod verdict;

// For authors of stores: the traits a backend implements, the checks, the purge driver,
// the record decoder, the contract as pure functions, name rules.
pub mod backend;

pub use admin::{Admin, CountSource, Forgot, ListFilter, PurgeCount, Released, Stats, Status};
pub use error::{BoxError, Error, Result, TimedOut};
pub use failure::{Failure, MAX_FAILURE_LEN, MAX_FAILURE_LINKS, error_chain};
pub use inbox::{
    Backoff, DuplicateLog, FailurePolicy, Handled, HandlerRetry, Inbox, InboxConfig, InboxError,
    Transient, TxAttempt, TxAttempts, TxEngine, TxHandle,
};
pub use key::Key;
pub use memory::MemoryStore;
pub use purge_run::PurgeRun;
pub use purger::{Purger, PurgerError, PurgerHandle, PurgerStats, PurgerWarning, Retention};
pub use store::{DedupStore, ItemResult};
pub use time::{Clock, ManualClock, SystemClock, Timestamp, duration_millis, parse_duration};
pub use tls::TlsFiles;
pub use types::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, Fingerprint, Lease, LeaseToken,
    MAX_BATCH_LEN, MAX_FINGERPRINT_LEN, MAX_LEASE, MAX_OUTCOME_LEN, MIN_LEASE, Pace, PurgeOptions,
    PurgeReport, Record, RecordState, TxClaim, idempotency_key,
};
pub use verdict::{DEAD_LETTER_PREFIX, FAILED_PREFIX, RESERVED_PREFIX, Verdict};
