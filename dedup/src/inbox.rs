//! The inbox: a handler runs once per key, and its outcome is stored.
//!
//! [`Inbox`] wraps any [`DedupStore`](crate::DedupStore). Each delivery ends as a
//! [`Handled`]. An [`InboxConfig`] sets leases, attempts, retries and the
//! [`FailurePolicy`]. A handler error wrapped in [`Transient`] is retried in place, after
//! a [`Backoff`].
//!
//! The transactional inbox of the SQL backends runs on [`TxEngine`]. A backend implements
//! [`TxAttempts`]; code generic over the backend uses [`TxHandle`].

pub use dedup_core::{
    Backoff, DuplicateLog, Failure, FailurePolicy, Handled, HandlerRetry, Inbox, InboxConfig,
    InboxError, MAX_FAILURE_LEN, MAX_FAILURE_LINKS, Transient, TxAttempt, TxAttempts, TxEngine,
    TxHandle, error_chain,
};
