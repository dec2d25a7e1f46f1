//! lapin's errors sorted into what a new connection may fix and what it cannot.

use lapin::ErrorKind;
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};

use crate::BrokerError;

/// `error` while doing `context`: [`BrokerError::Refused`] for refused credentials or
/// access, a missing or mismatched queue, a server speaking another protocol; otherwise (an
/// I/O error, a closed connection or channel, a forced close by a restarting broker, a
/// missed heartbeat) [`BrokerError::Broker`], which the receive loop reconnects after.
pub(crate) fn classify(context: impl Into<String>, error: lapin::Error) -> BrokerError {
    let fatal = match error.kind() {
        ErrorKind::ProtocolError(e) => matches!(
            e.kind(),
            AMQPErrorKind::Soft(
                AMQPSoftError::ACCESSREFUSED
                    | AMQPSoftError::NOTFOUND
                    | AMQPSoftError::PRECONDITIONFAILED
            ) | AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED | AMQPHardError::INVALIDPATH)
        ),
        ErrorKind::AuthProviderError(_) | ErrorKind::InvalidProtocolVersion(_) => true,
        _ => false,
    };
    if fatal {
        BrokerError::refused(context, error)
    } else {
        BrokerError::broker(context, error)
    }
}
