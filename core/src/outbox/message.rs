//! [`OutboxMessage`]: what a producer writes, checked when it is built.

use std::time::Duration;

use sha2::{Digest, Sha256};

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
/// Most headers on one message.
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxMessage {
    destination: String,
    message_id: String,
    headers: Vec<(String, String)>,
    payload: Vec<u8>,
    ordering_key: Option<String>,
    delay: Duration,
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
        Ok(OutboxMessage {
            destination,
            message_id,
            headers: Vec::new(),
            payload,
            ordering_key: None,
            delay: Duration::ZERO,
        })
    }

    /// The same message with one more header. Names: 1 to [`MAX_HEADER_NAME_LEN`] bytes of
    /// ASCII letters, digits and `-_.:`, each name at most once; values: at most
    /// [`MAX_HEADER_VALUE_LEN`] bytes, no control characters; at most [`MAX_HEADERS`].
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Result<Self> {
        let name = name.into();
        let value = value.into();
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
}

/// Writes messages from a transactional-inbox handler with ids derived from the incoming
/// key and each message's position: a handler that runs again (a retry, a redelivery after
/// a crash) derives the same ids in the same order, so the outbox keeps each once and the
/// downstream inbox sees the same ids.
///
/// The positions count the messages this value built, from 0; build them in the same
/// order on every run (a handler whose messages depend on something outside its
/// transaction should give its own ids instead).
#[derive(Clone, Debug)]
pub struct ConsumerOutbox {
    key: Key,
    next: u32,
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
        }
    }

    /// The next message, for `destination`, with the next derived id.
    pub fn message(
        &mut self,
        destination: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Result<OutboxMessage> {
        let id = derived_message_id(&self.key, self.next);
        self.next += 1;
        OutboxMessage::new(destination, id, payload)
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
}
