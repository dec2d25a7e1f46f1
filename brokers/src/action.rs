//! What a consumer does with a delivery: admit it or not, run the handler, and turn the
//! answer into one broker action. Written once; each broker applies the [`Action`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use dedup_core::trace::MessageTrace;
use dedup_core::{Handled, InboxError, Key};
use tracing::Instrument;

use crate::{ConsumerConfig, Delivery, Fault, Handle};

/// What the consumer asks of the broker for one delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Acknowledge: processed now or before, or failed for good (a stored failure).
    Ack,
    /// Deliver it again after `delay` (AMQP: nack with requeue after the delay; Redis
    /// Streams: leave it pending, reclaimed once idle; NATS: `Nak(delay)`).
    Retry {
        /// How long to wait before the redelivery.
        delay: Duration,
    },
    /// Move it to the dead letters with `reason` and the failure `headers`, then
    /// acknowledge it.
    DeadLetter {
        /// Why, for whoever reads the dead letters (the
        /// [`DEAD_LETTER_REASON`](crate::DEAD_LETTER_REASON) header).
        reason: String,
        /// The cause as headers for the copy ([`Fault::headers`]: error kind, message
        /// chain, attempts, consumer, time), which each broker writes its own way.
        headers: Vec<(String, String)>,
    },
}

/// The broker action for an inbox's answer (the mapping every consumer uses), as
/// `consumer` takes it.
///
/// | answer | action |
/// |---|---|
/// | `Processed`, `Duplicate` | ack |
/// | `Failed` (a stored failure: the key's final result) | ack |
/// | `Busy` | retry when the other worker's lease expires (at most `max_retry_delay`) |
/// | `DeadLetter` (attempts used up) | dead-letter |
/// | an error (handler failed and was released, lease lost, store down) | retry after `retry_delay` |
pub fn action_for(
    consumer: &str,
    answer: &Result<Handled, InboxError>,
    config: &ConsumerConfig,
) -> Action {
    match answer {
        Ok(Handled::Processed { .. } | Handled::Duplicate { .. } | Handled::Failed { .. }) => {
            Action::Ack
        }
        Ok(Handled::Busy { expires_at, .. }) => {
            let until = expires_at
                .to_system_time()
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            Action::Retry {
                delay: until.clamp(config.retry_delay.min(until), config.max_retry_delay),
            }
        }
        Ok(Handled::DeadLetter {
            attempts, cause, ..
        }) => {
            let fault = Fault {
                kind: cause
                    .as_ref()
                    .map_or_else(|| "attempts".to_owned(), |c| c.kind.clone()),
                message: cause.as_ref().map_or_else(
                    || format!("attempts used up ({attempts}); no failure was kept"),
                    |c| c.message(),
                ),
                attempts: *attempts,
                consumer: consumer.to_owned(),
                at: SystemTime::now(),
            };
            Action::DeadLetter {
                reason: match cause {
                    Some(cause) => format!(
                        "attempts used up ({attempts}); last failure ({} at attempt {}): {}",
                        cause.kind,
                        cause.attempt,
                        cause.message()
                    ),
                    None => format!("attempts used up ({attempts})"),
                },
                headers: fault.headers(),
            }
        }
        Err(_) => Action::Retry {
            delay: config.retry_delay,
        },
    }
}

/// Why a delivery is not admitted, if it is not: no message id, an id the store refuses,
/// or older than the admission floor.
pub fn refusal(
    consumer: &str,
    delivery: &Delivery,
    config: &ConsumerConfig,
) -> Result<Key, String> {
    let Some(id) = delivery.message_id.as_deref() else {
        return Err("no message id".into());
    };
    let key = Key::new(consumer, id).map_err(|e| format!("invalid message id: {e}"))?;
    if let (Some(max_age), Some(published)) = (config.max_age, delivery.published_at) {
        let age = SystemTime::now()
            .duration_since(published)
            .unwrap_or_default();
        if age > max_age {
            return Err(format!(
                "older than the admission floor: published {}s ago, max age {}s",
                age.as_secs(),
                max_age.as_secs()
            ));
        }
    }
    Ok(key)
}

/// Admit, handle, map: the action for one delivery.
pub(crate) async fn decide<H: Handle + ?Sized>(
    handler: &H,
    consumer: &str,
    delivery: &Delivery,
    config: &ConsumerConfig,
    counters: &Counters,
) -> Action {
    let key = match refusal(consumer, delivery, config) {
        Ok(key) => key,
        Err(reason) => {
            tracing::warn!(consumer, broker_ref = %delivery.broker_ref, %reason, "delivery refused");
            Counters::bump(&counters.refused);
            let fault = Fault {
                kind: "refused".into(),
                message: reason.clone(),
                attempts: 0,
                consumer: consumer.to_owned(),
                at: SystemTime::now(),
            };
            return Action::DeadLetter {
                reason,
                headers: fault.headers(),
            };
        }
    };
    // The handler runs with the delivery's trace in scope and under a span recording it:
    // the inbox's span and a ConsumerOutbox for this key pick it up.
    let trace = MessageTrace::from_headers(
        key.message_id(),
        delivery
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str())),
    );
    let span = tracing::info_span!(
        "dedup.consume",
        consumer,
        message_id = key.message_id(),
        broker_ref = %delivery.broker_ref,
        trace_id = tracing::field::Empty,
        correlation_id = tracing::field::Empty,
        causation_id = tracing::field::Empty,
    );
    trace.record(&span);
    let answer = trace
        .scope(handler.handle(&key, delivery))
        .instrument(span.clone())
        .await;
    let counter = match &answer {
        Ok(Handled::Processed { .. }) => &counters.processed,
        Ok(Handled::Duplicate { .. }) => &counters.duplicates,
        Ok(Handled::Failed { .. }) => &counters.failed,
        Ok(Handled::Busy { .. }) => &counters.busy,
        Ok(Handled::DeadLetter { .. }) => &counters.dead_letters,
        Err(e) => {
            let _in = span.enter();
            // The whole source chain: `dedup store failed` alone says nothing of the cause.
            // Recorded as a string, so a formatter escapes the control characters a
            // handler's error may quote from a payload.
            let chain = dedup_core::error_chain(e);
            tracing::warn!(consumer, message_id = key.message_id(), broker_ref = %delivery.broker_ref, error = chain.as_str(), "handler or store failed; retrying");
            &counters.errors
        }
    };
    Counters::bump(counter);
    action_for(consumer, &answer, config)
}

/// Counts of a consumer's deliveries by what happened to them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Handled now (`Processed`).
    pub processed: u64,
    /// Acknowledged as duplicates without running the handler.
    pub duplicates: u64,
    /// Stored failures (acknowledged).
    pub failed: u64,
    /// Busy elsewhere (redelivered later).
    pub busy: u64,
    /// Handler or store errors (redelivered later).
    pub errors: u64,
    /// Dead-lettered by the inbox's attempt limit.
    pub dead_letters: u64,
    /// Dead-lettered before the handler: no or invalid message id, or too old.
    pub refused: u64,
    /// Deliveries whose ack, nack or dead-letter the broker refused (they come back).
    pub settle_errors: u64,
    /// Times the connection was lost and made again.
    pub reconnects: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    processed: AtomicU64,
    duplicates: AtomicU64,
    failed: AtomicU64,
    busy: AtomicU64,
    errors: AtomicU64,
    dead_letters: AtomicU64,
    refused: AtomicU64,
    pub(crate) settle_errors: AtomicU64,
    pub(crate) reconnects: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> ConsumerStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ConsumerStats {
            processed: get(&self.processed),
            duplicates: get(&self.duplicates),
            failed: get(&self.failed),
            busy: get(&self.busy),
            errors: get(&self.errors),
            dead_letters: get(&self.dead_letters),
            refused: get(&self.refused),
            settle_errors: get(&self.settle_errors),
            reconnects: get(&self.reconnects),
        }
    }
}

#[cfg(test)]
mod tests;
