//! Following a message across hops: correlation and causation ids and a W3C `traceparent`,
//! carried as message headers.
//!
//! Every outbox message carries three headers, written by [`OutboxMessage`]:
//!
//! | header | value |
//! |---|---|
//! | [`CORRELATION_ID_HEADER`] (`dedup-correlation-id`) | the id shared by every message one business operation caused (an order's): the first message's own id unless the producer gives one, then carried unchanged from hop to hop |
//! | [`CAUSATION_ID_HEADER`] (`dedup-causation-id`) | the id of the message whose handling wrote this one (absent on a first message unless the producer gives one) |
//! | [`TRACEPARENT_HEADER`] (`traceparent`) | a [W3C trace context](https://www.w3.org/TR/trace-context/) `traceparent`, version `00`: the trace id carried from the incoming message's `traceparent`, or derived from the correlation id; a parent id derived from this message's id (a new one per hop, the same on every retry) |
//!
//! The broker adapters publish the headers with the message and read them back into
//! their delivery; a [`MessageTrace`] is what a consumer knows of the incoming message.
//! While a consumer's handler runs, the incoming message's trace is in scope
//! ([`MessageTrace::scope`]): the inbox's `dedup_inbox` span records its `trace_id`,
//! `correlation_id` and `causation_id`, and a [`ConsumerOutbox`](crate::outbox::ConsumerOutbox)
//! built for the incoming key carries them on to the messages it builds. The relay's
//! `dedup.outbox.publish` spans record the same fields, so the logs of one order (the
//! producer's write, the relay's publish, each consumer's inbox and what it sends on)
//! share one trace id.
//!
//! The workspace has no OpenTelemetry dependency: the trace id is logged as a field, not
//! set on a `tracing` span's OpenTelemetry context. A service using OpenTelemetry links
//! its spans itself: give the producer's current `traceparent` to
//! [`OutboxMessage::traceparent`], and on the consumer side read
//! [`MessageTrace::traceparent`] (or the `traceparent` header) and set it as the handler
//! span's parent or link with its propagator.
//!
//! [`OutboxMessage`]: crate::outbox::OutboxMessage
//! [`OutboxMessage::traceparent`]: crate::outbox::OutboxMessage::traceparent

use std::fmt;
use std::future::Future;

use sha2::{Digest, Sha256};

use crate::Key;
use crate::types::hex;

/// The header carrying the correlation id.
pub const CORRELATION_ID_HEADER: &str = "dedup-correlation-id";
/// The header carrying the causation id (the id of the message that caused this one).
pub const CAUSATION_ID_HEADER: &str = "dedup-causation-id";
/// The W3C trace context header.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// Longest correlation or causation id taken from a delivery's headers, in bytes (longer
/// ones, or ones with control characters, are ignored as absent).
pub const MAX_TRACE_ID_LEN: usize = 255;

/// A W3C `traceparent`: a 16-byte trace id, the 8-byte id of the parent span and the
/// trace flags. Written as version `00`: `00-<32 hex>-<16 hex>-<2 hex>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceParent {
    trace_id: [u8; 16],
    parent_id: [u8; 8],
    flags: u8,
}

impl TraceParent {
    /// Parse a `traceparent` value: version `00` exactly as the W3C format says, or a
    /// later version whose first four fields read the same (its further fields are
    /// dropped). `None` for anything else: version `ff`, upper-case hex, an all-zero trace
    /// or parent id, a wrong length.
    pub fn parse(value: &str) -> Option<TraceParent> {
        let value = value.trim();
        let b = value.as_bytes();
        if b.len() < 55 {
            return None;
        }
        let version = hex_bytes::<1>(&value[0..2])?[0];
        if version == 0xff || (version == 0 && b.len() != 55) || (b.len() > 55 && b[55] != b'-') {
            return None;
        }
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let trace_id = hex_bytes::<16>(&value[3..35])?;
        let parent_id = hex_bytes::<8>(&value[36..52])?;
        let flags = hex_bytes::<1>(&value[53..55])?[0];
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            parent_id,
            flags,
        })
    }

    /// The `traceparent` a first message gets: the trace id derived from
    /// `correlation_id`, the parent id from `message_id`, sampled.
    pub fn derived(correlation_id: &str, message_id: &str) -> TraceParent {
        TraceParent {
            trace_id: derive(b"dedup-trace-id", correlation_id),
            parent_id: derive(b"dedup-span-id", message_id),
            flags: 0x01,
        }
    }

    /// The `traceparent` for `message_id`, sent while handling this one: the same trace
    /// id and flags, a parent id derived from `message_id`.
    pub fn child(&self, message_id: &str) -> TraceParent {
        TraceParent {
            parent_id: derive(b"dedup-span-id", message_id),
            ..*self
        }
    }

    /// The trace id, 32 lower-case hex characters.
    pub fn trace_id(&self) -> String {
        hex(&self.trace_id)
    }

    /// The parent (span) id, 16 lower-case hex characters.
    pub fn parent_id(&self) -> String {
        hex(&self.parent_id)
    }

    /// The trace flags (bit 0: sampled).
    pub fn flags(&self) -> u8 {
        self.flags
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.parent_id),
            self.flags
        )
    }
}

/// What is known of one message's place in a flow: its id, its correlation id, the id of
/// the message that caused it, and its `traceparent`. Read from a delivery's headers
/// ([`from_headers`](Self::from_headers)) or from an outbox message
/// ([`OutboxMessage::trace`](crate::outbox::OutboxMessage::trace)).
#[derive(Clone, Debug)]
pub struct MessageTrace {
    message_id: String,
    correlation_id: String,
    causation_id: Option<String>,
    /// `None`: derived from the correlation id and the message id when asked for (two
    /// SHA-256 digests, which a consumer whose spans nobody records never needs).
    traceparent: Option<TraceParent>,
}

impl PartialEq for MessageTrace {
    fn eq(&self, other: &Self) -> bool {
        self.message_id == other.message_id
            && self.correlation_id == other.correlation_id
            && self.causation_id == other.causation_id
            && self.traceparent() == other.traceparent()
    }
}

impl Eq for MessageTrace {}

tokio::task_local! {
    static CURRENT: MessageTrace;
}

impl MessageTrace {
    /// The trace of a message that starts a flow: its own id as the correlation id, no
    /// causation, a `traceparent` derived from its id.
    pub fn start(message_id: &str) -> MessageTrace {
        MessageTrace {
            message_id: message_id.to_owned(),
            correlation_id: message_id.to_owned(),
            causation_id: None,
            traceparent: None,
        }
    }

    /// The trace of the message `message_id` with `headers` (names matched ignoring
    /// ASCII case). A missing, over-long ([`MAX_TRACE_ID_LEN`]) or control-character
    /// correlation id is the message id (the message starts a flow); such a causation id
    /// is absent; a missing or invalid `traceparent` is derived from the correlation id
    /// and the message id.
    pub fn from_headers<'a>(
        message_id: &str,
        headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> MessageTrace {
        let (mut correlation, mut causation, mut traceparent) = (None, None, None);
        for (name, value) in headers {
            if name.eq_ignore_ascii_case(CORRELATION_ID_HEADER) {
                correlation = usable(value);
            } else if name.eq_ignore_ascii_case(CAUSATION_ID_HEADER) {
                causation = usable(value);
            } else if name.eq_ignore_ascii_case(TRACEPARENT_HEADER) {
                traceparent = TraceParent::parse(value);
            }
        }
        let correlation_id = correlation.unwrap_or(message_id).to_owned();
        MessageTrace {
            message_id: message_id.to_owned(),
            correlation_id,
            causation_id: causation.map(str::to_owned),
            traceparent,
        }
    }

    pub(crate) fn from_parts(
        message_id: &str,
        correlation_id: &str,
        causation_id: Option<&str>,
        traceparent: TraceParent,
    ) -> MessageTrace {
        MessageTrace {
            message_id: message_id.to_owned(),
            correlation_id: correlation_id.to_owned(),
            causation_id: causation_id.map(str::to_owned),
            traceparent: Some(traceparent),
        }
    }

    /// The message's id.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// Its correlation id.
    pub fn correlation_id(&self) -> &str {
        &self.correlation_id
    }

    /// The id of the message that caused it, if known.
    pub fn causation_id(&self) -> Option<&str> {
        self.causation_id.as_deref()
    }

    /// Its `traceparent`.
    pub fn traceparent(&self) -> TraceParent {
        self.traceparent
            .unwrap_or_else(|| TraceParent::derived(&self.correlation_id, &self.message_id))
    }

    /// Its trace id (32 hex characters), as the spans record it.
    pub fn trace_id(&self) -> String {
        self.traceparent().trace_id()
    }

    /// Run `work` with this trace in scope: [`current`](Self::current) answers it, the
    /// inbox's span records it, a [`ConsumerOutbox`](crate::outbox::ConsumerOutbox) for
    /// this message's key follows it. The broker consumers run each handler so. The scope
    /// is the task running `work`: a task it spawns does not see it, blocking work sees it
    /// through [`carry`](Self::carry).
    pub async fn scope<F: Future>(self, work: F) -> F::Output {
        CURRENT.scope(self, work).await
    }

    /// `work` with the trace in scope now (if any) in scope again when it runs: for
    /// blocking work handed to another thread (`spawn_blocking`), which the scope does not
    /// reach by itself. A backend running a handler on the blocking pool wraps it so.
    pub fn carry<T, F>(work: F) -> impl FnOnce() -> T + Send
    where
        F: FnOnce() -> T + Send,
    {
        let current = Self::current();
        move || match current {
            Some(trace) => CURRENT.sync_scope(trace, work),
            None => work(),
        }
    }

    /// The trace in scope, if any.
    pub fn current() -> Option<MessageTrace> {
        CURRENT.try_with(Clone::clone).ok()
    }

    /// The trace in scope if it is that of `key`'s message.
    pub fn current_for(key: &Key) -> Option<MessageTrace> {
        CURRENT
            .try_with(|t| (t.message_id == key.message_id()).then(|| t.clone()))
            .ok()
            .flatten()
    }

    /// Record `trace_id`, `correlation_id` and `causation_id` on `span` (fields it
    /// declared, empty or not; others are ignored).
    pub fn record(&self, span: &tracing::Span) {
        if span.is_disabled() {
            // No subscriber takes it: skip formatting the ids.
            return;
        }
        span.record("trace_id", self.trace_id().as_str());
        span.record("correlation_id", self.correlation_id.as_str());
        if let Some(c) = &self.causation_id {
            span.record("causation_id", c.as_str());
        }
    }

    /// Record the trace in scope for `key` on `span`, if there is one.
    pub(crate) fn record_current(key: &Key, span: &tracing::Span) {
        if let Some(t) = Self::current_for(key) {
            t.record(span);
        }
    }
}

/// A header value usable as a carried id.
fn usable(value: &str) -> Option<&str> {
    (!value.is_empty() && value.len() <= MAX_TRACE_ID_LEN && !value.chars().any(char::is_control))
        .then_some(value)
}

fn derive<const N: usize>(domain: &[u8], text: &str) -> [u8; N] {
    let mut h = Sha256::new();
    h.update(domain);
    h.update((text.len() as u64).to_be_bytes());
    h.update(text.as_bytes());
    let digest = h.finalize();
    let mut out = [0u8; N];
    out.copy_from_slice(&digest[..N]);
    if out == [0u8; N] {
        // All zero is invalid in a traceparent.
        out[N - 1] = 1;
    }
    out
}

fn hex_bytes<const N: usize>(text: &str) -> Option<[u8; N]> {
    let b = text.as_bytes();
    if b.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in b.chunks(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_parses_and_prints_back() {
        let tp = TraceParent::parse(SAMPLE).expect("valid");
        assert_eq!(tp.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(tp.parent_id(), "00f067aa0ba902b7");
        assert_eq!(tp.flags(), 1);
        assert_eq!(tp.to_string(), SAMPLE);
        // A later version with a further field reads its first four.
        let later = format!("01{}-extra", &SAMPLE[2..]);
        assert_eq!(
            TraceParent::parse(&later).unwrap().trace_id(),
            tp.trace_id()
        );
    }

    #[test]
    fn invalid_traceparents_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn derivation_is_stable_and_a_child_keeps_the_trace_id() {
        let a = TraceParent::derived("order-1", "order-1");
        assert_eq!(a, TraceParent::derived("order-1", "order-1"));
        assert_ne!(
            a.trace_id(),
            TraceParent::derived("order-2", "order-1").trace_id()
        );
        let child = a.child("invoice-1");
        assert_eq!(child.trace_id(), a.trace_id());
        assert_ne!(child.parent_id(), a.parent_id());
        assert_eq!(child, a.child("invoice-1"), "the same on a retry");
        assert_eq!(TraceParent::parse(&child.to_string()), Some(child));
    }

    #[test]
    fn headers_are_read_and_missing_ones_start_a_flow() {
        let t = MessageTrace::from_headers(
            "m-2",
            [
                ("Dedup-Correlation-Id", "order-1"),
                ("dedup-causation-id", "m-1"),
                ("traceparent", SAMPLE),
            ],
        );
        assert_eq!(t.correlation_id(), "order-1");
        assert_eq!(t.causation_id(), Some("m-1"));
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");

        let bare = MessageTrace::from_headers("m-9", [("traceparent", "garbage")]);
        assert_eq!(bare, MessageTrace::start("m-9"));
        assert_eq!(bare.correlation_id(), "m-9");
        assert_eq!(bare.causation_id(), None);
        let long = "x".repeat(MAX_TRACE_ID_LEN + 1);
        let t = MessageTrace::from_headers("m-3", [(CORRELATION_ID_HEADER, long.as_str())]);
        assert_eq!(t.correlation_id(), "m-3", "an unusable id is ignored");
    }

    #[tokio::test]
    async fn the_scope_answers_only_for_its_own_key() {
        assert_eq!(MessageTrace::current(), None);
        let t = MessageTrace::start("m-1");
        let (mine, other) = t
            .clone()
            .scope(async {
                (
                    MessageTrace::current_for(&Key::new("c", "m-1").unwrap()),
                    MessageTrace::current_for(&Key::new("c", "m-2").unwrap()),
                )
            })
            .await;
        assert_eq!(mine, Some(t.clone()));
        assert_eq!(other, None);
        // Carried to a blocking thread.
        let seen = t
            .clone()
            .scope(async {
                tokio::task::spawn_blocking(MessageTrace::carry(MessageTrace::current))
                    .await
                    .unwrap()
            })
            .await;
        assert_eq!(seen, Some(t));
    }
}
