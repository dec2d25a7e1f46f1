//! [`NatsPending`]: one JetStream message, and how it is acked, retried or dead-lettered.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::HeaderMap;
use async_nats::jetstream::{AckKind, Message};
use async_trait::async_trait;

use super::publisher::{headers, send};
use super::{MSG_ID_HEADER, ORIGIN_HEADER};
use crate::{Action, BrokerError, DEAD_LETTER_REASON, Delivery, Pending, Shutdown};

/// One JetStream message and what settles it (its dead letter is published through the
/// message's own JetStream context: the consumer's).
///
/// The dead-letter copy carries the message's headers, its `Nats-Msg-Id`, the reason, the
/// failure headers and the subject it was read from ([`ORIGIN_HEADER`]). A copy the
/// dead-letter stream drops as a duplicate is not stored: JetStream keeps each
/// `Nats-Msg-Id` for the stream's duplicate window, also after the copy was deleted (a
/// replayed message that failed again within the window). The original is then `Nak`ed
/// and dead-lettered again after `retry_delay`, until the window has passed.
#[derive(Debug)]
pub struct NatsPending {
    delivery: Delivery,
    message: Message,
    dead_letter_subject: Arc<str>,
    retry_delay: Duration,
}

#[async_trait]
impl Pending for NatsPending {
    fn delivery(&self) -> &Delivery {
        &self.delivery
    }

    async fn settle(self, action: Action, _shutdown: &Shutdown) -> Result<(), BrokerError> {
        let (kind, unpublished) = match action {
            Action::Ack => (AckKind::Ack, None),
            Action::Retry { delay } => (AckKind::Nak(Some(delay)), None),
            Action::DeadLetter { reason, headers } => {
                match self.dead_letter(&reason, &headers).await {
                    Ok(()) => (AckKind::Term, None),
                    Err(e) => {
                        tracing::warn!(error = %dedup_core::error_chain(&*e), "dead letter not published; retrying");
                        (AckKind::Nak(Some(self.retry_delay)), Some(e))
                    }
                }
            }
        };
        // Not settled: JetStream redelivers after `ack_wait`.
        self.message
            .ack_with(kind)
            .await
            .map_err(|e| BrokerError::broker("acking a message", e))?;
        match unpublished {
            Some(e) => Err(BrokerError::broker(
                format!("publishing a dead letter to {}", self.dead_letter_subject),
                e,
            )),
            None => Ok(()),
        }
    }
}

impl NatsPending {
    pub(super) fn new(
        message: Message,
        dead_letter_subject: Arc<str>,
        retry_delay: Duration,
    ) -> Self {
        NatsPending {
            delivery: delivery(&message),
            message,
            dead_letter_subject,
            retry_delay,
        }
    }

    async fn dead_letter(
        &self,
        reason: &str,
        fault: &[(String, String)],
    ) -> Result<(), dedup_core::BoxError> {
        let d = &self.delivery;
        let id = d.message_id.as_deref().map(|id| (MSG_ID_HEADER, id));
        let origin = self.message.message.subject.as_str();
        let map = headers(
            d.headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .filter(|(n, _)| *n != ORIGIN_HEADER && !fault.iter().any(|(f, _)| f == n))
                .chain(id)
                .chain([(DEAD_LETTER_REASON, reason), (ORIGIN_HEADER, origin)])
                .chain(fault.iter().map(|(n, v)| (n.as_str(), v.as_str()))),
        )?;
        let ack = send(
            &self.message.context,
            &self.dead_letter_subject,
            map,
            d.payload.clone(),
        )
        .await?
        .await?;
        if ack.duplicate {
            return Err(format!(
                "stream {} dropped the copy as a duplicate: a copy with the same {MSG_ID_HEADER} \
                 came within its duplicate window (the message was replayed and failed again)",
                ack.stream
            )
            .into());
        }
        Ok(())
    }
}

fn delivery(message: &Message) -> Delivery {
    let headers = message.message.headers.as_ref();
    let info = message.info().ok();
    Delivery {
        message_id: headers
            .and_then(|h| h.get(MSG_ID_HEADER))
            .map(|v| v.as_str().to_owned()),
        payload: message.message.payload.clone(),
        headers: headers.map(text_headers).unwrap_or_default(),
        published_at: info.as_ref().map(|i| SystemTime::from(i.published)),
        redelivered: info.as_ref().is_some_and(|i| i.delivered > 1),
        broker_ref: info
            .map(|i| i.stream_sequence.to_string())
            .unwrap_or_default(),
    }
}

/// Every header but `Nats-Msg-Id`, one pair per value, in the map's order.
pub(super) fn text_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| AsRef::<str>::as_ref(*name) != MSG_ID_HEADER)
        .flat_map(|(name, values)| {
            values
                .iter()
                .map(move |v| (AsRef::<str>::as_ref(name).to_owned(), v.as_str().to_owned()))
        })
        .collect()
}
