//! [`InboxConfig`] and [`FailurePolicy`].

use std::time::Duration;

use super::HandlerRetry;
use crate::Retention;
use crate::layers::RetryPolicy;

/// How an [`Inbox`](super::Inbox) claims, renews, commits and treats failures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxConfig {
    /// The lease each claim and each renewal asks for.
    pub lease: Duration,
    /// How often the lease is renewed while the handler runs (`None`: a third of `lease`,
    /// so two renewals can fail before the lease runs out).
    pub renew_every: Option<Duration>,
    /// How a commit that failed with a retryable error is tried again (commit is
    /// retry-safe): the same rule as the [`Retry`](crate::layers::Retry) layer.
    pub commit_retry: RetryPolicy,
    /// The most attempts a key gets (`None`: no limit). Every acquisition counts, a
    /// takeover after a crash included (a message that crashes its worker is the worst
    /// kind of poison). A delivery that would be attempt `max_attempts + 1` does not run
    /// the handler: the key is completed as dead-lettered and the delivery, and every later
    /// one, gets [`Handled::DeadLetter`](super::Handled::DeadLetter). An operator resets
    /// the key with [`Admin::forget`](crate::Admin::forget) (`dedup forget CONSUMER ID`):
    /// the next delivery runs the handler again as attempt 1.
    pub max_attempts: Option<u32>,
    /// What a handler error does to the key.
    pub failures: FailurePolicy,
    /// How a handler that failed with a [`Transient`](super::Transient) error runs again in
    /// process before the delivery is given back (default: never), in
    /// [`Inbox::handle`](super::Inbox::handle) (so in every broker consumer built on it)
    /// and the transactional inboxes.
    pub handler_retry: HandlerRetry,
    /// Whether each suppressed duplicate is logged (default: no).
    pub log_duplicates: DuplicateLog,
    /// The purge the inbox runs on its store in the background (default
    /// [`Retention::default`]: records kept 7 days, a paced purge every 10 minutes).
    /// `None` turns it off. It starts with the first delivery the inbox (or any clone of
    /// it) handles, inside that delivery's tokio runtime, once, and stops when the last
    /// clone is dropped; a `keep` shorter than [`lease`](Self::lease) is refused (logged at
    /// `WARN`, nothing purged). Each inbox built runs its own (several on one store, or on
    /// several nodes, are safe: see [`Retention`]).
    pub retention: Option<Retention>,
}

impl Default for InboxConfig {
    /// A 30-second lease renewed every 10 seconds, the default commit [`RetryPolicy`], no
    /// attempt limit, failures released for a retry, no retry in process, no log line per
    /// duplicate, records purged after 7 days.
    fn default() -> Self {
        InboxConfig {
            lease: Duration::from_secs(30),
            renew_every: None,
            commit_retry: RetryPolicy::default(),
            max_attempts: None,
            failures: FailurePolicy::Retry,
            handler_retry: HandlerRetry::NEVER,
            log_duplicates: DuplicateLog::Off,
            retention: Some(Retention::default()),
        }
    }
}

/// What an [`Inbox`](super::Inbox) does when the handler returns an error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Release the lease and return [`InboxError::Handler`](super::InboxError::Handler): the
    /// next delivery runs the handler again at once.
    #[default]
    Retry,
    /// Commit the failure (its message and source chain) as the key's outcome and return
    /// [`Handled::Failed`](super::Handled::Failed): later deliveries get the same failure back
    /// without running the handler (what payment APIs do with an idempotency key). For
    /// failures that repeating cannot fix: a declined card, a validation error.
    Store,
}

/// Whether an inbox logs each delivery it did not run the handler for because the key was
/// already completed (a duplicate, a replayed failure or dead letter) or is being processed
/// by another worker (busy): one `WARN` event, target `dedup_core::inbox`, message
/// `duplicate suppressed`, fields `consumer`, `result` (`duplicate`, `failed`,
/// `dead_letter`, `busy`) and, if allowed, `message_id`.
///
/// Off by default: at-least-once delivery makes duplicates routine, and the
/// `dedup_claims_total{result="completed"}` counter already counts them. Turn it on to see
/// *which* messages a producer or broker sends twice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DuplicateLog {
    /// No log line per duplicate.
    #[default]
    Off,
    /// A `WARN` per duplicate with the consumer, without the message id (for message ids
    /// that carry personal data, like [`ObserveOptions::without_message_ids`](crate::layers::ObserveOptions::without_message_ids)).
    WithoutMessageIds,
    /// A `WARN` per duplicate with the consumer and the message id.
    WithMessageIds,
}
