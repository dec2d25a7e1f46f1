//! gRPC statuses from Pub/Sub sorted into what a new attempt may fix and what it cannot.

use gcloud_gax::grpc::{Code, Status};

use crate::BrokerError;

/// `status` while doing `context`: [`BrokerError::Refused`] for refused credentials or
/// permissions, a subscription or topic that does not exist, or an invalid request;
/// otherwise (the server unreachable or restarting, a timeout, overload)
/// [`BrokerError::Broker`], which the receive loop reconnects after.
pub(crate) fn classify(context: impl Into<String>, status: Status) -> BrokerError {
    if refused(&status) {
        BrokerError::refused(context, status)
    } else {
        BrokerError::broker(context, status)
    }
}

/// Whether no retry fixes `status`.
pub(crate) fn refused(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unauthenticated
            | Code::PermissionDenied
            | Code::NotFound
            | Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::Unimplemented
    )
}
