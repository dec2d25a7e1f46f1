//! [`Delivery`]: one message as a broker handed it over, in a broker-neutral shape.

use std::time::SystemTime;

use bytes::Bytes;
use dedup_core::trace::{CAUSATION_ID_HEADER, CORRELATION_ID_HEADER, MessageTrace};

/// One message as the broker delivered it. The consumers build it from the broker's own
/// message type; handlers read the payload and headers from it.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// The broker's message id property (AMQP `message_id`, the stream entry's
    /// `message_id` field, the `Nats-Msg-Id` header), or `None` when the message has none
    /// (such a delivery is dead-lettered, never handled).
    pub message_id: Option<String>,
    /// The payload.
    pub payload: Bytes,
    /// The headers (AMQP headers whose values are strings, the stream entry's other
    /// fields, NATS headers), in no particular order.
    pub headers: Vec<(String, String)>,
    /// When the broker (or the publisher, for AMQP's `timestamp` property) says the message
    /// was published, if it says: what the admission floor
    /// ([`ConsumerConfig::max_age`](crate::ConsumerConfig::max_age)) compares.
    pub published_at: Option<SystemTime>,
    /// Whether the broker says it delivered this message before (AMQP `redelivered`, a
    /// reclaimed stream entry, a NATS delivery count above 1).
    pub redelivered: bool,
    /// The broker's handle on this delivery, for logs: the AMQP delivery tag, the stream
    /// entry id, the JetStream stream sequence.
    pub broker_ref: String,
}

impl Delivery {
    /// The first header named `name` (exact match), if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The correlation id an outbox message carries (the `dedup-correlation-id` header,
    /// any case), as sent; `None` when the producer sent none.
    pub fn correlation_id(&self) -> Option<&str> {
        self.header_any_case(CORRELATION_ID_HEADER)
    }

    /// The causation id (the `dedup-causation-id` header, any case): the id of the message
    /// whose handling sent this one; `None` on a message that started its flow.
    pub fn causation_id(&self) -> Option<&str> {
        self.header_any_case(CAUSATION_ID_HEADER)
    }

    /// This message's place in its flow, as [`MessageTrace::from_headers`] reads it (a
    /// missing correlation id or `traceparent` starts one), or `None` without a message
    /// id. The consumers put it in scope while the handler runs, so a
    /// [`ConsumerOutbox`](dedup_core::outbox::ConsumerOutbox) for the delivery's key
    /// follows it without being told.
    pub fn trace(&self) -> Option<MessageTrace> {
        let id = self.message_id.as_deref()?;
        Some(MessageTrace::from_headers(
            id,
            self.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
        ))
    }

    fn header_any_case(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}
