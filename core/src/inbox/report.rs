//! What the inboxes say about a delivery: the metrics they count and the log lines they
//! write, the same in lease mode ([`Inbox`](super::Inbox)) and in the transactional one
//! ([`TxEngine`](super::TxEngine)).
//!
//! Failure log lines (target `dedup_core::inbox`) name the consumer, the message id, the
//! attempt, the cause's kind and its chain (`outer: inner: root`); failure metrics are
//! labelled by consumer, mode and the cause's kind only (a few fixed words), never by
//! message id, so their cardinality stays bounded. The cause is recorded as a string value,
//! not through `Display`: a formatter quotes and escapes it (`tracing-subscriber`'s `fmt`
//! writes `\u{1b}` and `\n`), so a cause quoting a payload's control characters cannot
//! clear the terminal that shows the log, or split its line.

use std::future::Future;
use std::time::Instant;

use tracing::Instrument;

use super::{DuplicateLog, Handled, InboxError};
use crate::layers::metric_names as m;
use crate::{Failure, Key};

/// Count a handler run started again, by `reason` (`transient`, `database`, `conflict`).
pub(super) fn retry_counted(key: &Key, mode: Mode, reason: &'static str) {
    metrics::counter!(m::HANDLER_RETRIES_TOTAL, "consumer" => key.consumer().to_owned(), "mode" => mode.label(), "reason" => reason)
        .increment(1);
}

/// Log a delivery that did not run the handler, as [`DuplicateLog`] asks.
pub(super) fn log_duplicate(log: DuplicateLog, key: &Key, result: &'static str) {
    match log {
        DuplicateLog::Off => {}
        DuplicateLog::WithoutMessageIds => {
            tracing::warn!(consumer = key.consumer(), result, "duplicate suppressed")
        }
        DuplicateLog::WithMessageIds => tracing::warn!(
            consumer = key.consumer(),
            message_id = key.message_id(),
            result,
            "duplicate suppressed"
        ),
    }
}

/// The kind label of a cause (`unknown` for dead letters written before causes were kept).
fn kind_label(cause: Option<&Failure>) -> String {
    cause.map_or_else(|| "unknown".to_owned(), |c| c.kind.clone())
}

/// Count a dead-lettered delivery and say so.
pub(super) fn dead_letter_counted<T>(
    key: &Key,
    attempts: u32,
    cause: Option<Failure>,
    replay: bool,
    mode: Mode,
) -> Result<Handled<T>, InboxError> {
    metrics::counter!(m::DEAD_LETTERS_TOTAL, "consumer" => key.consumer().to_owned(), "replay" => if replay { "true" } else { "false" }, "mode" => mode.label(), "kind" => kind_label(cause.as_ref()))
        .increment(1);
    Ok(Handled::DeadLetter {
        attempts,
        replay,
        cause,
    })
}

/// Log the key just dead-lettered: its attempts used, the attempt that found none left,
/// and the last cause.
pub(super) fn log_dead_letter(key: &Key, attempt: u32, attempts: u32, cause: &Failure) {
    let message = cause.message();
    tracing::warn!(
        consumer = key.consumer(),
        message_id = key.message_id(),
        attempt,
        attempts,
        kind = %cause.kind,
        cause = message.as_str(),
        "dead-lettered: the key used up its attempts"
    );
}

/// Count and log one failed attempt: `settled` says what became of the key
/// (`released for a retry`, `stored as the key's result`).
pub(super) fn attempt_failed(key: &Key, mode: Mode, failure: &Failure, settled: &'static str) {
    metrics::counter!(m::HANDLER_FAILURES_TOTAL, "consumer" => key.consumer().to_owned(), "mode" => mode.label(), "kind" => failure.kind.clone())
        .increment(1);
    let message = failure.message();
    tracing::warn!(
        consumer = key.consumer(),
        message_id = key.message_id(),
        attempt = failure.attempt,
        kind = %failure.kind,
        cause = message.as_str(),
        worker = failure.worker.as_deref(),
        mode = mode.label(),
        "dedup inbox: attempt failed; {settled}"
    );
}

/// Count a handler failure stored as the key's result.
pub(super) fn failure_stored(key: &Key, mode: Mode, failure: &Failure) {
    metrics::counter!(m::STORED_FAILURES_TOTAL, "consumer" => key.consumer().to_owned(), "mode" => mode.label(), "kind" => failure.kind.clone())
        .increment(1);
}

/// Which wrapper handled a delivery: the `mode` label and span field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// [`Inbox`](super::Inbox): the handler runs under a renewed lease.
    Lease,
    /// [`TxEngine`](super::TxEngine): the handler runs inside the store's transaction.
    Tx,
}

impl Mode {
    pub(super) fn label(self) -> &'static str {
        match self {
            Mode::Lease => "lease",
            Mode::Tx => "tx",
        }
    }
}

/// Run one delivery of `key` in its `dedup_inbox` span and record how it ended.
///
/// The span's fields are `mode`, `consumer`, `attempt` (recorded by `delivery` on the span
/// it is given), `result` and the message trace in scope for `key`.
pub(super) async fn in_delivery_span<T, Fut>(
    key: &Key,
    mode: Mode,
    delivery: impl FnOnce(tracing::Span) -> Fut,
) -> Result<Handled<T>, InboxError>
where
    Fut: Future<Output = Result<Handled<T>, InboxError>>,
{
    let span = tracing::debug_span!(
        "dedup_inbox",
        mode = mode.label(),
        consumer = key.consumer(),
        attempt = tracing::field::Empty,
        result = tracing::field::Empty,
        trace_id = tracing::field::Empty,
        correlation_id = tracing::field::Empty,
        causation_id = tracing::field::Empty,
    );
    crate::trace::MessageTrace::record_current(key, &span);
    let handled = delivery(span.clone()).instrument(span.clone()).await;
    span.record("result", result_name(&handled));
    handled
}

/// The `result` field of the `dedup_inbox` span.
fn result_name<T>(handled: &Result<Handled<T>, InboxError>) -> &'static str {
    match handled {
        Ok(handled) => handled_name(handled),
        Err(InboxError::Handler { .. }) => "handler_error",
        Err(InboxError::Conflict { .. }) => "conflict",
        Err(InboxError::LeaseLost { .. }) => "lease_lost",
        Err(InboxError::Store(_)) => "store_error",
        Err(InboxError::Outcome { .. }) => "outcome_error",
    }
}

/// The name of a [`Handled`] in spans and logs.
pub(super) fn handled_name<T>(handled: &Handled<T>) -> &'static str {
    match handled {
        Handled::Processed { .. } => "processed",
        Handled::Duplicate { .. } => "duplicate",
        Handled::Busy { .. } => "busy",
        Handled::Failed { .. } => "failed",
        Handled::DeadLetter { .. } => "dead_letter",
    }
}

/// Record how long a handler ran and how it ended.
pub(super) fn handler_finished(key: &Key, mode: Mode, result: &'static str, started: Instant) {
    metrics::histogram!(m::HANDLER_DURATION_SECONDS, "consumer" => key.consumer().to_owned(), "result" => result, "mode" => mode.label())
        .record(started.elapsed().as_secs_f64());
}
