//! Keys: which consumer processed which message.

use std::fmt;

use crate::{Error, Result};

/// The identity of one unit of work: `(consumer, message_id)`.
///
/// Idempotency is scoped per consumer: a Billing consumer and a Notification consumer both
/// process the same message, and neither may skip it because of the other's record.
///
/// Both parts are validated on construction: non-empty, no NUL bytes, the consumer at most
/// [`Key::MAX_CONSUMER_LEN`] bytes and the message id at most [`Key::MAX_MESSAGE_ID_LEN`]
/// bytes (UTF-8). A `Key` that exists is valid, so stores never see bad ids.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    consumer: String,
    message_id: String,
}

impl Key {
    /// Longest consumer name, in bytes.
    pub const MAX_CONSUMER_LEN: usize = 200;
    /// Longest message id, in bytes.
    pub const MAX_MESSAGE_ID_LEN: usize = 255;

    /// A key for `message_id` as seen by `consumer`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] when a part is empty, holds a NUL byte or is too long
    /// ([`MAX_CONSUMER_LEN`](Self::MAX_CONSUMER_LEN),
    /// [`MAX_MESSAGE_ID_LEN`](Self::MAX_MESSAGE_ID_LEN)).
    ///
    /// # Examples
    ///
    /// ```
    /// use dedup_core::Key;
    /// let key = Key::new("billing", "order-42")?;
    /// assert_eq!(key.consumer(), "billing");
    /// assert!(Key::new("billing", "").is_err());
    /// # Ok::<(), dedup_core::Error>(())
    /// ```
    pub fn new(consumer: impl Into<String>, message_id: impl Into<String>) -> Result<Self> {
        let consumer = consumer.into();
        let message_id = message_id.into();
        check_part("consumer", &consumer, Self::MAX_CONSUMER_LEN)?;
        check_part("message id", &message_id, Self::MAX_MESSAGE_ID_LEN)?;
        Ok(Key {
            consumer,
            message_id,
        })
    }

    /// A key whose message id is a UUID (hyphenated lowercase form).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an invalid consumer name (see [`new`](Self::new)).
    pub fn from_uuid(consumer: impl Into<String>, message_id: uuid::Uuid) -> Result<Self> {
        Self::new(consumer, message_id.hyphenated().to_string())
    }

    /// The consumer part.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// The message id part.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }
}

fn check_part(what: &'static str, value: &str, max: usize) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid(what, "must not be empty"));
    }
    if value.len() > max {
        return Err(Error::invalid(
            what,
            format!("{} bytes, at most {max} allowed", value.len()),
        ));
    }
    if value.contains('\0') {
        return Err(Error::invalid(what, "must not contain NUL bytes"));
    }
    Ok(())
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?}, {:?})", self.consumer, self.message_id)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.consumer, self.message_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_keys_are_accepted_at_the_limits() {
        let k = Key::new("c".repeat(200), "m".repeat(255)).unwrap();
        assert_eq!(k.consumer().len(), 200);
        assert_eq!(k.message_id().len(), 255);
        let u = uuid::Uuid::nil();
        let k = Key::from_uuid(String::from("billing"), u).unwrap();
        assert_eq!(k.message_id(), "00000000-0000-0000-0000-000000000000");
    }

    #[test]
    fn invalid_keys_are_typed_errors() {
        for (c, m, what) in [
            ("", "m", "consumer"),
            ("c", "", "message id"),
            ("c\0x", "m", "consumer"),
            ("c", "m\0", "message id"),
        ] {
            match Key::new(c, m) {
                Err(Error::InvalidInput { what: w, .. }) => assert_eq!(w, what),
                other => panic!("{c:?}/{m:?}: expected InvalidInput, got {other:?}"),
            }
        }
        assert!(
            Key::new("c".repeat(201), "m")
                .unwrap_err()
                .is_invalid_input()
        );
        assert!(
            Key::new("c", "m".repeat(256))
                .unwrap_err()
                .is_invalid_input()
        );
        // Length is in bytes, not chars: 128 two-byte chars = 256 bytes.
        assert!(
            Key::new("c", "é".repeat(128))
                .unwrap_err()
                .is_invalid_input()
        );
    }
}
