//! [`Handled`]: what happened to one delivery.

use crate::{Failure, Lease, Timestamp};

/// What happened to one delivery. `O` is the outcome's type: bytes for
/// [`Inbox::handle`](super::Inbox::handle), the handler's own type for
/// `Inbox::handle_json` (feature `serde`).
///
/// Deliberately exhaustive: each variant asks the consumer for a different acknowledgement,
/// and a new one must be a compile error in a `match`, not a silent `_ => ack`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handled<O = Option<Vec<u8>>> {
    /// This call ran the handler and committed its outcome: acknowledge the message.
    Processed {
        /// The outcome the handler returned (and the store kept for duplicates).
        outcome: O,
        /// The lease the work ran under (its fence, attempt and idempotency key).
        lease: Lease,
    },
    /// Already processed earlier: a replay. Acknowledge the message without processing it.
    Duplicate {
        /// When it was processed.
        processed_at: Timestamp,
        /// The outcome stored then (byte for byte, or decoded as the handler's type).
        outcome: O,
    },
    /// Another worker is processing it right now: do not acknowledge; let the broker
    /// redeliver (negative-acknowledge with requeue, or leave it pending) after `expires_at`.
    Busy {
        /// When the other worker's lease expires unless renewed.
        expires_at: Timestamp,
        /// The other worker's attempt number.
        attempt: u32,
    },
    /// The handler failed and the failure is the key's final result
    /// ([`FailurePolicy::Store`](super::FailurePolicy::Store)): acknowledge the message (or
    /// route it to your failures queue); it will not be processed again.
    Failed {
        /// The failure's message and source chain, as stored.
        error: String,
        /// `false` for the delivery whose handler failed, `true` for later deliveries that
        /// got the stored failure back.
        replay: bool,
    },
    /// The key used up its attempts ([`InboxConfig::max_attempts`](super::InboxConfig)): the
    /// handler was not run. Move the message to your dead-letter queue and acknowledge it.
    DeadLetter {
        /// The attempts the key had used.
        attempts: u32,
        /// Why its last failed attempt failed, as stored with the dead letter: the error
        /// its handler returned, or, when no attempt ended with an error (they crashed or
        /// timed out), a cause of kind `attempts` saying so. `None` only for dead letters
        /// stored before causes were kept.
        cause: Option<Failure>,
        /// `false` for the delivery that dead-lettered the key, `true` for later ones.
        replay: bool,
    },
}

impl<O> Handled<O> {
    /// Whether this delivery got a stored result back instead of running the handler
    /// ([`Duplicate`](Handled::Duplicate), and replayed [`Failed`](Handled::Failed) and
    /// [`DeadLetter`](Handled::DeadLetter)).
    pub fn is_replay(&self) -> bool {
        match self {
            Handled::Duplicate { .. } => true,
            Handled::Failed { replay, .. } | Handled::DeadLetter { replay, .. } => *replay,
            Handled::Processed { .. } | Handled::Busy { .. } => false,
        }
    }

    /// Whether the message is done with (processed now or before, failed for good, or
    /// dead-lettered) and may be acknowledged: everything but [`Busy`](Handled::Busy).
    pub fn is_settled(&self) -> bool {
        !matches!(self, Handled::Busy { .. })
    }
}
