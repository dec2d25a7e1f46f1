//! async-nats's lookup errors sorted into what a new attempt may fix and what it cannot.

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{GetStreamError, GetStreamErrorKind};
use async_nats::jetstream::stream::{ConsumerError, ConsumerErrorKind};

use crate::BrokerError;

/// A failed stream lookup while doing `context`: [`BrokerError::Refused`] for a stream
/// that does not exist or an invalid name; otherwise (the server unreachable, a timeout)
/// [`BrokerError::Broker`], which the receive loop reconnects after.
pub(crate) fn stream_lookup(context: String, error: GetStreamError) -> BrokerError {
    let refused = match error.kind() {
        GetStreamErrorKind::JetStream(js) => js.error_code() == ErrorCode::STREAM_NOT_FOUND,
        GetStreamErrorKind::EmptyName | GetStreamErrorKind::InvalidStreamName => true,
        _ => false,
    };
    if refused {
        BrokerError::refused(context, error)
    } else {
        BrokerError::broker(context, error)
    }
}

/// A failed durable consumer lookup or creation while doing `context`:
/// [`BrokerError::Refused`] for an invalid name or consumer type; otherwise
/// [`BrokerError::Broker`].
pub(crate) fn consumer_lookup(context: String, error: ConsumerError) -> BrokerError {
    match error.kind() {
        ConsumerErrorKind::InvalidName | ConsumerErrorKind::InvalidConsumerType => {
            BrokerError::refused(context, error)
        }
        _ => BrokerError::broker(context, error),
    }
}
