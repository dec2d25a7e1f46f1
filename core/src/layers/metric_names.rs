//! The names of the metrics `dedup` emits (Prometheus style), for dashboards and alerts.
//!
//! Labels: `backend` (the name given to [`Observed`](super::Observed)), `consumer` (the
//! key's consumer; never the message id, which would make a series per message), `op`
//! (`claim`, `claim_many`, `commit`, `commit_many`, `renew`, `release`, `get`, `purge`),
//! `outcome` and `kind` as listed per metric; `mode` on the inbox's own metrics: `lease`
//! for the [`Inbox`](crate::Inbox), `tx` for the transactional inbox
//! ([`TxEngine`](crate::TxEngine), whose commits inside a transaction count in
//! [`COMMITS_TOTAL`] and whose lost ones in [`LEASE_LOST_TOTAL`] with `op = commit_in_tx`).

/// Counter: claims (batch items included) by `outcome`: `acquired` (first attempt),
/// `takeover` (acquired with attempt > 1: the previous lease expired or was released),
/// `in_flight` (another worker holds a live lease), `completed` (a duplicate of a processed
/// message). Labels `backend`, `consumer`, `outcome`.
pub const CLAIMS_TOTAL: &str = "dedup_claims_total";
/// Counter: successful commits (batch items included). Labels `backend`, `consumer`.
pub const COMMITS_TOTAL: &str = "dedup_commits_total";
/// Counter: commits, renewals and releases answered `LeaseLost` (another worker took the
/// key over). Labels `backend`, `consumer`, `op`.
pub const LEASE_LOST_TOTAL: &str = "dedup_lease_lost_total";
/// Counter: claims refused because the message id came back with another payload.
/// Labels `backend`, `consumer`.
pub const FINGERPRINT_MISMATCH_TOTAL: &str = "dedup_fingerprint_mismatch_total";
/// Counter: successful releases. Labels `backend`, `consumer`.
pub const RELEASES_TOTAL: &str = "dedup_releases_total";
/// Counter: successful renewals. Labels `backend`, `consumer`.
pub const RENEWALS_TOTAL: &str = "dedup_renewals_total";
/// Counter: records removed by purges. Label `backend`.
pub const PURGED_TOTAL: &str = "dedup_purged_total";
/// Counter: failed operations other than the contract outcomes above, by `kind`:
/// `invalid_input`, `unsupported`, `corrupt`, `backend_retryable`, `backend`, `other`.
/// Labels `backend`, `op`, `kind`.
pub const ERRORS_TOTAL: &str = "dedup_errors_total";
/// Histogram: time each store operation took, in seconds. Labels `backend`, `op`.
pub const OPERATION_DURATION_SECONDS: &str = "dedup_operation_duration_seconds";
/// Histogram: time the [`Inbox`](crate::Inbox)'s handlers ran, in seconds, by `result`:
/// `ok`, `error`, `panic`, `lease_lost`, `conflict` (a transactional run the database
/// refused over a conflict). Labels `consumer`, `result`, `mode`.
pub const HANDLER_DURATION_SECONDS: &str = "dedup_handler_duration_seconds";
/// Counter: deliveries the [`Inbox`](crate::Inbox) told to dead-letter because the key used
/// up its attempts (poison messages). Labels `consumer`, `replay` (`false` the first time,
/// `true` for later deliveries of the same key), `mode`, `kind` (the last cause's
/// [`Failure::kind`](crate::Failure::kind); `unknown` for dead letters stored without one).
pub const DEAD_LETTERS_TOTAL: &str = "dedup_dead_letters_total";
/// Counter: handler failures the [`Inbox`](crate::Inbox) stored as the key's outcome
/// ([`FailurePolicy::Store`](crate::FailurePolicy::Store)). Labels `consumer`, `mode`,
/// `kind`.
pub const STORED_FAILURES_TOTAL: &str = "dedup_stored_failures_total";
/// Counter: failed attempts (the handler's error, a panic, an outcome that could not be
/// stored, a store failure inside the transactional inbox's attempt), each of which the
/// inbox kept on the key's record. Labels `consumer`, `mode`, `kind` (the
/// [`Failure::kind`](crate::Failure::kind): `handler`, `transient`, `panic`, `outcome`,
/// `store`, `conflict`); never the message id.
pub const HANDLER_FAILURES_TOTAL: &str = "dedup_handler_failures_total";
/// Counter: handler runs started again in process after a
/// [`Transient`](crate::Transient) error ([`HandlerRetry`](crate::HandlerRetry)), and, in
/// the transactional inbox, after an error the database asked to retry, by `reason`:
/// `transient`, `conflict` (a deadlock, a serialization failure: run again under the same
/// lease, no attempt used) or `database` (another retryable error: a new attempt). Labels
/// `consumer`, `mode`, `reason`.
pub const HANDLER_RETRIES_TOTAL: &str = "dedup_handler_retries_total";

/// Counter: outbox rows published and marked sent by a relay. Labels `publisher`,
/// `destination`.
pub const OUTBOX_PUBLISHED_TOTAL: &str = "dedup_outbox_published_total";
/// Counter: failed publishes of outbox rows. Labels `publisher`, `destination`.
pub const OUTBOX_PUBLISH_FAILURES_TOTAL: &str = "dedup_outbox_publish_failures_total";
/// Counter: outbox rows made dead after their last attempt. Label `destination`.
pub const OUTBOX_DEAD_TOTAL: &str = "dedup_outbox_dead_total";
/// Counter: outbox rows a relay published but could not mark, because its hold ran out and
/// another relay took them (they are published again). Label `backend`.
pub const OUTBOX_LOST_MARKS_TOTAL: &str = "dedup_outbox_lost_marks_total";
/// Histogram: time a relay's publish of one batch took, in seconds. Label `publisher`.
pub const OUTBOX_PUBLISH_DURATION_SECONDS: &str = "dedup_outbox_publish_duration_seconds";
/// Histogram: from a row's commit (its write time) to its publish, in seconds. Label
/// `publisher`.
pub const OUTBOX_COMMIT_TO_PUBLISH_SECONDS: &str = "dedup_outbox_commit_to_publish_seconds";
/// Gauge: outbox rows not yet sent (pending or held), as a relay last read them. Label
/// `backend`.
pub const OUTBOX_PENDING: &str = "dedup_outbox_pending";
/// Gauge: dead outbox rows, as a relay last read them. Label `backend`.
pub const OUTBOX_DEAD: &str = "dedup_outbox_dead";
/// Gauge: age in seconds of the oldest unsent outbox row, as a relay last read it. Label
/// `backend`.
pub const OUTBOX_OLDEST_UNSENT_SECONDS: &str = "dedup_outbox_oldest_unsent_seconds";
