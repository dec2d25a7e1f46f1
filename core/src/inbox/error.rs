//! [`InboxError`]: why [`Inbox::handle`](super::Inbox::handle) failed.

use crate::{BoxError, Error, Failure, Key};

/// Why [`Inbox::handle`](super::Inbox::handle) failed. In every case the message must not
/// be acknowledged as processed; the broker's redelivery retries it.
///
/// It is a plain `std::error::Error + Send + Sync + 'static` whatever the handler's error
/// type (the handler's error is kept boxed as the `source`), so `?` turns it into
/// `anyhow::Error` or `Box<dyn Error + Send + Sync>`. Get the handler's own error back with
/// [`InboxError::handler_error`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// The handler returned an error. The lease was released, with the failure kept on the
    /// key's record ([`Record::last_failure`](crate::Record::last_failure)), so the next
    /// delivery retries at once.
    #[error("handler failed for {key} at attempt {}; the lease was released for a retry", failure.attempt)]
    Handler {
        /// The key.
        key: Key,
        /// The failure as it was kept on the record (kind, chain, attempt, when, worker).
        failure: Box<Failure>,
        /// The handler's error.
        #[source]
        source: BoxError,
    },
    /// The database refused the transactional inbox's transaction over a conflict with a
    /// concurrent one (a deadlock, a serialization failure, a lock wait timeout, SQLite
    /// busy) every time it ran: the first run and each run again of the inbox's
    /// [`RetryPolicy`](crate::layers::RetryPolicy), all under the same lease, as one
    /// attempt (see [`TxEngine`](super::TxEngine)). The lease was released, with the
    /// failure (kind `conflict`) kept on the key's record, so the next delivery runs again
    /// as the next attempt. Never stored as the key's result, whatever the
    /// [`FailurePolicy`](super::FailurePolicy).
    #[error("the database refused the transaction for {key} over a conflict at attempt {}, on every run; the lease was released for a retry", failure.attempt)]
    Conflict {
        /// The key.
        key: Key,
        /// The failure as it was kept on the record (kind `conflict`).
        failure: Box<Failure>,
        /// The last run's error: the handler's, or the store's [`Error`] (begin, commit).
        #[source]
        source: BoxError,
    },
    /// The lease was lost while the handler ran (renewal or commit answered `LeaseLost`):
    /// another worker took the key over after the lease expired. If the renewal noticed,
    /// the handler was stopped (its future dropped) at its next await point. Side effects it
    /// made before that are not undone; protect them with the lease's fence or idempotency key.
    #[error("lease lost while handling {key}")]
    LeaseLost {
        /// The key.
        key: Key,
    },
    /// The store failed (claim, or commit after retries), or refused the outcome. The lease,
    /// if any, expires by itself. A store [`Error`] converts into it, so `?` works in a
    /// hand-written broker handler.
    #[error("dedup store failed")]
    Store(#[from] Error),
    /// A typed outcome could not be encoded (after the handler ran: nothing was committed,
    /// the lease was released) or a stored one could not be decoded as the handler's type.
    #[error("outcome of {key} could not be encoded or decoded")]
    Outcome {
        /// The key.
        key: Key,
        /// The encoder's error.
        #[source]
        source: BoxError,
    },
}

impl InboxError {
    /// The handler's error, if this is [`InboxError::Handler`] and it is an `E` (or a
    /// [`Transient`](super::Transient) wrapping an `E`).
    pub fn handler_error<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            InboxError::Handler { source, .. } => source.downcast_ref().or_else(|| {
                source
                    .downcast_ref::<super::Transient>()
                    .and_then(|t| t.get_ref().downcast_ref())
            }),
            _ => None,
        }
    }

    /// Whether this is [`InboxError::Conflict`].
    pub fn is_conflict(&self) -> bool {
        matches!(self, InboxError::Conflict { .. })
    }

    /// Whether this is [`InboxError::LeaseLost`].
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, InboxError::LeaseLost { .. })
    }
}
