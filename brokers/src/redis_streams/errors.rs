//! redis-rs's errors sorted into what a new connection may fix and what it cannot.

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::BrokerError;

/// `error` while doing `context`: [`BrokerError::Broker`] (the receive loop reconnects) for
/// a lost, refused or timed-out connection and a server still loading or failing over;
/// [`BrokerError::Refused`] for the rest (refused credentials, a key of another type, a
/// command the server refuses).
pub(crate) fn classify(context: impl Into<String>, error: RedisError) -> BrokerError {
    let retryable = error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || matches!(
            error.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
            )
        );
    if retryable {
        BrokerError::broker(context, error)
    } else {
        BrokerError::refused(context, error)
    }
}
