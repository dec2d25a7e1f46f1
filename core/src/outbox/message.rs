//! [`OutboxMessage`]: what a producer writes, checked when it is built.

use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::trace::{
    CAUSATION_ID_HEADER, CORRELATION_ID_HEADER, MessageTrace, TRACEPARENT_HEADER, TraceParent,
};
use crate::{Error, Key, Lease, Result};

/// Longest destination (an exchange, a stream, a subject), in bytes.
pub const MAX_DESTINATION_LEN: usize = 255;
/// Longest outbox message id, in bytes.
pub const MAX_MESSAGE_ID_LEN: usize = 255;
/// Longest ordering key, in bytes.
pub const MAX_ORDERING_KEY_LEN: usize = 255;
/// Largest payload, in bytes (1 MiB). Larger documents belong in object storage, with a
/// reference in the message.
pub const MAX_PAYLOAD_LEN: usize = 1 << 20;
/// Most headers on one message (the correlation id and `traceparent` every message
/// carries, and a causation id when set, included).
pub const MAX_HEADERS: usize = 64;
/// Longest header name, in bytes.
pub const MAX_HEADER_NAME_LEN: usize = 128;
/// Longest header value, in bytes.
pub const MAX_HEADER_VALUE_LEN: usize = 4096;
/// Longest delay before a message is due ([`OutboxMessage::deliver_after`]): 30 days.
pub const MAX_DELAY: Duration = Duration::from_secs(30 * 24 * 3600);

/// One message for the outbox: where it goes, its id, headers and payload, and optionally
/// an ordering key and a delay. Every field is checked when it is set, so a built message
/// is valid; a rejected one is [`Error::InvalidInput`] and nothing is written.
///
/// The message id is what makes re-publishing safe: the relay publishes at least once, and
/// the downstream consumer uses the id as its inbox key. Give a stable id (the same on every
/// retry of the producing transaction), or derive it with [`ConsumerOutbox`] inside a
/// transactional-inbox handler. An id already in the outbox is kept once: enqueueing it
/// again writes nothing.
///
/// Every message carries, among its headers, the headers of [`crate::trace`]: a
/// correlation id (`dedup-correlation-id`; the message's own id unless
/// [`correlation_id`](Self::correlation_id) gives another), a causation id
/// (`dedup-causation-id`, only when [`causation_id`](Self::causation_id) or
/// [`follows`](Self::follows) sets it) and a W3C `traceparent` (derived from the
/// correlation id and the message id unless [`traceparent`](Self::traceparent) gives the
/// producer's own). They are stored with the row and published as broker headers, so the
/// consumer's delivery carries them; [`trace`](Self::trace) reads them back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxMessage {
    destination: String,
    message_id: String,
    headers: Vec<(String, String)>,
    payload: Vec<u8>,
    ordering_key: Option<String>,
    delay: Duration,
    /// Whether the `traceparent` was given (kept when the correlation id changes) rather
    /// than derived.
    traceparent_given: bool,
}

impl OutboxMessage {
    /// A message for `destination` (non-empty, at most [`MAX_DESTINATION_LEN`] bytes, no
    /// control characters) with `message_id` (the same rules, [`MAX_MESSAGE_ID_LEN`]) and
    /// `payload` (at most [`MAX_PAYLOAD_LEN`] bytes).
    pub fn new(
        destination: impl Into<String>,
        message_id: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Result<Self> {
        let destination = destination.into();
        let message_id = message_id.into();
        let payload = payload.into();
        check_text("destination", &destination, MAX_DESTINATION_LEN)?;
        check_text("outbox message id", &message_id, MAX_MESSAGE_ID_LEN)?;
        if payload.len() > MAX_PAYLOAD_LEN {
            return Err(invalid(
                "outbox payload",
                format!(
                    "{} bytes, over the limit of {MAX_PAYLOAD_LEN}; store large documents \
                     elsewhere and send a reference",
                    payload.len()
                ),
            ));
        }
        let headers = vec![
            (CORRELATION_ID_HEADER.to_owned(), message_id.clone()),
            (
                TRACEPARENT_HEADER.to_owned(),
                TraceParent::derived(&message_id, &message_id).to_string(),
            ),
        ];
        Ok(OutboxMessage {
            destination,
            message_id,
            headers,
            payload,
            ordering_key: None,
            delay: Duration::ZERO,
            traceparent_given: false,
        })
    }

    /// The same message with one more header. Names: 1 to [`MAX_HEADER_NAME_LEN`] bytes of
    /// ASCII letters, digits and `-_.:`, each name at most once; values: at most
    /// [`MAX_HEADER_VALUE_LEN`] bytes, no control characters; at most [`MAX_HEADERS`].
    /// The names of [`crate::trace`] (any case) set those headers as
    /// [`correlation_id`](Self::correlation_id), [`causation_id`](Self::causation_id) and
    /// [`traceparent`](Self::traceparent) do, replacing the value.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Result<Self> {
        let name = name.into();
        let value = value.into();
        if name.eq_ignore_ascii_case(CORRELATION_ID_HEADER) {
            return self.correlation_id(value);
        }
        if name.eq_ignore_ascii_case(CAUSATION_ID_HEADER) {
            return self.causation_id(value);
        }
        if name.eq_ignore_ascii_case(TRACEPARENT_HEADER) {
            return self.traceparent(&value);
        }
        if name.is_empty() || name.len() > MAX_HEADER_NAME_LEN {
            return Err(invalid(
                "outbox header name",
                format!("must be 1 to {MAX_HEADER_NAME_LEN} bytes long"),
            ));
        }
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
        {
            return Err(invalid(
                "outbox header name",
                format!("{name:?} has {c:?}; use ASCII letters, digits and -_.:"),
            ));
        }
        if self
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(&name))
        {
            return Err(invalid(
                "outbox header name",
                format!("{name:?} is set twice"),
            ));
        }
        if self.headers.len() >= MAX_HEADERS {
            return Err(invalid(
                "outbox headers",
                format!("more than {MAX_HEADERS} headers"),
            ));
        }
        if value.len() > MAX_HEADER_VALUE_LEN {
            return Err(invalid(
                "outbox header value",
                format!("{name}: over {MAX_HEADER_VALUE_LEN} bytes"),
            ));
        }
        if value.chars().any(char::is_control) {
            return Err(invalid(
                "outbox header value",
                format!("{name}: control characters are not allowed"),
            ));
        }
        self.headers.push((name, value));
        Ok(self)
    }

    /// The same message with `id` as its correlation id (the same rules as a message id).
    /// A derived `traceparent` is derived again from it; a given one is kept.
    pub fn correlation_id(mut self, id: impl Into<String>) -> Result<Self> {
        let id = id.into();
        check_text("correlation id", &id, MAX_MESSAGE_ID_LEN)?;
        if !self.traceparent_given {
            let tp = TraceParent::derived(&id, &self.message_id).to_string();
            self.set_header(TRACEPARENT_HEADER, tp);
        }
        self.set_header(CORRELATION_ID_HEADER, id);
        Ok(self)
    }

    /// The same message with `id` (the id of the message or request that caused it) as
    /// its causation id (the same rules as a message id).
    pub fn causation_id(mut self, id: impl Into<String>) -> Result<Self> {
        let id = id.into();
        check_text("causation id", &id, MAX_MESSAGE_ID_LEN)?;
        self.set_header(CAUSATION_ID_HEADER, id);
        Ok(self)
    }

    /// The same message with the producer's W3C `traceparent` (its current span's, from
    /// an incoming request or an OpenTelemetry propagator), kept as given: the consumer
    /// then shares the producer's trace id. A value [`TraceParent::parse`] refuses is
    /// [`Error::InvalidInput`].
    pub fn traceparent(mut self, value: &str) -> Result<Self> {
        let Some(tp) = TraceParent::parse(value) else {
            return Err(invalid(
                "traceparent",
                format!("{value:?} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)"),
            ));
        };
        self.set_header(TRACEPARENT_HEADER, tp.to_string());
        self.traceparent_given = true;
        Ok(self)
    }

    /// The same message sent while handling `incoming`: its correlation id carried, the
    /// incoming message's id as causation id, and a `traceparent` with the incoming trace
    /// id and a parent id derived from this message's id. What [`ConsumerOutbox`] does
    /// for each message it builds.
    pub fn follows(mut self, incoming: &MessageTrace) -> Result<Self> {
        let tp = incoming.traceparent().child(&self.message_id);
        self = self
            .correlation_id(incoming.correlation_id())?
            .causation_id(incoming.message_id())?;
        self.set_header(TRACEPARENT_HEADER, tp.to_string());
        self.traceparent_given = true;
        Ok(self)
    }

    /// Replace the value of the header `name` (one of [`crate::trace`]'s), or add it.
    fn set_header(&mut self, name: &str, value: String) {
        match self.headers.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => *v = value,
            None => self.headers.push((name.to_owned(), value)),
        }
    }

    /// The same message with an ordering key: messages sharing it are published one at a
    /// time, in the order their transactions committed. The same rules as a destination.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Result<Self> {
        let key = key.into();
        check_text("ordering key", &key, MAX_ORDERING_KEY_LEN)?;
        self.ordering_key = Some(key);
        Ok(self)
    }

    /// The same message, due `delay` after its transaction wrote it (at most
    /// [`MAX_DELAY`]).
    pub fn deliver_after(mut self, delay: Duration) -> Result<Self> {
        if delay > MAX_DELAY {
            return Err(invalid(
                "outbox delay",
                format!("{delay:?} is over the limit of {MAX_DELAY:?}"),
            ));
        }
        self.delay = delay;
        Ok(self)
    }

    /// Where the message goes.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// The message's id.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// Its headers, in the order they were added.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// Its payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Its ordering key.
    pub fn ordering_key_str(&self) -> Option<&str> {
        self.ordering_key.as_deref()
    }

    /// How long after writing it is due.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// Its correlation id, causation id and `traceparent`, as a consumer reads them.
    pub fn trace(&self) -> MessageTrace {
        let get = |name: &str| {
            self.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        let correlation = get(CORRELATION_ID_HEADER).unwrap_or(&self.message_id);
        let traceparent = get(TRACEPARENT_HEADER)
            .and_then(TraceParent::parse)
            .unwrap_or_else(|| TraceParent::derived(correlation, &self.message_id));
        MessageTrace::from_parts(
            &self.message_id,
            correlation,
            get(CAUSATION_ID_HEADER),
            traceparent,
        )
    }
}

/// Writes messages from a transactional-inbox handler with ids derived from the incoming
/// key and each message's position: a handler that runs again (a retry, a redelivery after
/// a crash) derives the same ids in the same order, so the outbox keeps each once and the
/// downstream inbox sees the same ids.
///
/// The positions count the messages this value built, from 0; build them in the same
/// order on every run (a handler whose messages depend on something outside its
/// transaction should give its own ids instead).
///
/// Each message [`follows`](OutboxMessage::follows) the incoming message: its causation
/// id is the incoming message id (the key's), its correlation id the incoming one, its
/// `traceparent` carries the incoming trace id with a parent id of its own. The incoming
/// trace is the one in scope for the key ([`MessageTrace::current_for`]: the broker
/// consumers put the delivery's in scope while the handler runs), or one given with
/// [`following`](Self::following); without either, the incoming message starts the flow
/// ([`MessageTrace::start`]: correlation id = the incoming message id). The scope is the
/// handler's task (a backend running the handler on the blocking pool carries it there
/// with [`MessageTrace::carry`]); a handler building messages in a task of its own gives
/// the delivery's trace with [`following`](Self::following).
#[derive(Clone, Debug)]
pub struct ConsumerOutbox {
    key: Key,
    next: u32,
    incoming: MessageTrace,
}

impl ConsumerOutbox {
    /// Ids derived from `lease`'s key.
    pub fn new(lease: &Lease) -> Self {
        Self::for_key(&lease.key)
    }

    /// Ids derived from `key`.
    pub fn for_key(key: &Key) -> Self {
        ConsumerOutbox {
            key: key.clone(),
            next: 0,
            incoming: MessageTrace::current_for(key)
                .unwrap_or_else(|| MessageTrace::start(key.message_id())),
        }
    }

    /// The same outbox, following `incoming` (a delivery's trace) rather than the one in
    /// scope.
    pub fn following(mut self, incoming: MessageTrace) -> Self {
        self.incoming = incoming;
        self
    }

    /// The trace its messages follow.
    pub fn incoming(&self) -> &MessageTrace {
        &self.incoming
    }

    /// The next message, for `destination`, with the next derived id, following the
    /// incoming message.
    pub fn message(
        &mut self,
        destination: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Result<OutboxMessage> {
        let id = derived_message_id(&self.key, self.next);
        self.next += 1;
        OutboxMessage::new(destination, id, payload)?.follows(&self.incoming)
    }
}

/// The id [`ConsumerOutbox`] gives the message at `position` written while handling `key`:
/// 32 hex characters of SHA-256 over the key, a dot and the position (`3f2a...e1.0`).
pub fn derived_message_id(key: &Key, position: u32) -> String {
    let mut h = Sha256::new();
    for part in [key.consumer(), key.message_id()] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    h.update(b"outbox");
    let digest = h.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}.{position}")
}

fn check_text(what: &'static str, text: &str, max: usize) -> Result<()> {
    if text.is_empty() {
        return Err(invalid(what, "must not be empty".to_owned()));
    }
    if text.len() > max {
        return Err(invalid(
            what,
            format!("{} bytes, over the limit of {max}", text.len()),
        ));
    }
    if text.chars().any(char::is_control) {
        return Err(invalid(
            what,
            "control characters (NUL, newline, ...) are not allowed".to_owned(),
        ));
    }
    Ok(())
}

fn invalid(what: &'static str, reason: String) -> Error {
    Error::InvalidInput { what, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_is_refused_with_what_was_wrong() {
        assert!(OutboxMessage::new("", "id", b"x".to_vec()).is_err());
        assert!(OutboxMessage::new("orders", "", b"x".to_vec()).is_err());
        assert!(OutboxMessage::new("orders", "a\0b", b"x".to_vec()).is_err());
        let big = vec![0u8; MAX_PAYLOAD_LEN + 1];
        let err = OutboxMessage::new("orders", "id", big).unwrap_err();
        assert!(err.to_string().contains("over the limit"), "{err}");
        let m = OutboxMessage::new("orders", "id", b"x".to_vec()).unwrap();
        assert!(m.clone().header("bad name", "v").is_err());
        assert!(m.clone().header("ok", "line\nbreak").is_err());
        assert!(m.clone().header("", "v").is_err());
        let m = m.header("ok", "v").unwrap();
        assert!(m.clone().header("OK", "again").is_err());
        assert!(m.deliver_after(MAX_DELAY + Duration::from_secs(1)).is_err());
    }

    #[test]
    fn derived_ids_are_stable_and_differ_by_key_and_position() {
        let a = Key::new("billing", "order-1").unwrap();
        let b = Key::new("billing", "order-2").unwrap();
        assert_eq!(derived_message_id(&a, 0), derived_message_id(&a, 0));
        assert_ne!(derived_message_id(&a, 0), derived_message_id(&a, 1));
        assert_ne!(derived_message_id(&a, 0), derived_message_id(&b, 0));
        let mut out = ConsumerOutbox::for_key(&a);
        let first = out.message("invoices", b"1".to_vec()).unwrap();
        assert_eq!(first.message_id(), derived_message_id(&a, 0));
        assert!(first.message_id().ends_with(".0"));
    }

    #[test]
    fn a_first_message_starts_its_own_correlation_and_trace() {
        let m = OutboxMessage::new("orders", "order-1", b"x".to_vec()).unwrap();
        let t = m.trace();
        assert_eq!(t.correlation_id(), "order-1");
        assert_eq!(t.causation_id(), None);
        assert_eq!(t.traceparent(), TraceParent::derived("order-1", "order-1"));
        assert_eq!(
            m.headers()[0],
            (CORRELATION_ID_HEADER.into(), "order-1".into())
        );
        // A given correlation id re-derives the trace id; a given traceparent is kept.
        let m = m.correlation_id("req-7").unwrap();
        assert_eq!(m.trace().correlation_id(), "req-7");
        assert_eq!(
            m.trace().trace_id(),
            TraceParent::derived("req-7", "x").trace_id()
        );
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let m = m.traceparent(tp).unwrap().correlation_id("req-8").unwrap();
        assert_eq!(m.trace().traceparent().to_string(), tp);
        let m = m.causation_id("http-1").unwrap();
        assert_eq!(m.trace().causation_id(), Some("http-1"));
        // Each well-known header once, whatever sets it.
        let m = m.header("Dedup-Causation-Id", "http-2").unwrap();
        let n = |name: &str| {
            m.headers()
                .iter()
                .filter(|(h, _)| h.eq_ignore_ascii_case(name))
                .count()
        };
        assert_eq!((n(CAUSATION_ID_HEADER), n(TRACEPARENT_HEADER)), (1, 1));
        assert_eq!(m.trace().causation_id(), Some("http-2"));
        assert!(m.clone().traceparent("nope").is_err());
        assert!(m.clone().correlation_id("").is_err());
        assert!(m.causation_id("a\nb").is_err());
    }

    #[test]
    fn a_consumers_messages_follow_the_incoming_one() {
        let key = Key::new("billing", "order-1").unwrap();
        let incoming = OutboxMessage::new("orders", "order-1", b"x".to_vec())
            .unwrap()
            .correlation_id("checkout-9")
            .unwrap()
            .trace();
        let mut out = ConsumerOutbox::for_key(&key).following(incoming.clone());
        let first = out.message("invoices", b"1".to_vec()).unwrap();
        let second = out.message("mails", b"2".to_vec()).unwrap();
        for m in [&first, &second] {
            let t = m.trace();
            assert_eq!(t.causation_id(), Some("order-1"));
            assert_eq!(t.correlation_id(), "checkout-9");
            assert_eq!(t.trace_id(), incoming.trace_id());
            assert_ne!(
                t.traceparent().parent_id(),
                incoming.traceparent().parent_id()
            );
        }
        assert_ne!(
            first.trace().traceparent().parent_id(),
            second.trace().traceparent().parent_id(),
            "a parent id per message"
        );
        // Without an incoming trace the incoming message starts the flow.
        let mut bare = ConsumerOutbox::for_key(&key);
        let t = bare.message("invoices", b"1".to_vec()).unwrap().trace();
        assert_eq!(t.correlation_id(), "order-1");
        assert_eq!(t.causation_id(), Some("order-1"));
        assert_eq!(t.trace_id(), MessageTrace::start("order-1").trace_id());
    }

    #[tokio::test]
    async fn the_trace_in_scope_is_followed_for_its_own_key() {
        let key = Key::new("billing", "order-1").unwrap();
        let incoming = MessageTrace::from_headers(
            "order-1",
            [
                (CORRELATION_ID_HEADER, "checkout-9"),
                (
                    TRACEPARENT_HEADER,
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                ),
            ],
        );
        let t = incoming
            .scope(async {
                ConsumerOutbox::for_key(&key)
                    .message("invoices", b"1".to_vec())
                    .unwrap()
                    .trace()
            })
            .await;
        assert_eq!(t.correlation_id(), "checkout-9");
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }
}
