//! Turning async-nats errors into [`dedup_core::Error`], the driver error kept as `source`.

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use dedup_core::Error;

/// The backend name in [`Error::Backend`].
pub(crate) const BACKEND: &str = "nats-kv";

/// Codes of JetStream API errors a retry can help with: no quorum or no leader yet
/// (during an election or a node's loss), storage busy.
const RETRYABLE_CODES: [ErrorCode; 5] = [
    ErrorCode::CLUSTER_NOT_AVAILABLE,
    ErrorCode::CLUSTER_INCOMPLETE,
    ErrorCode::CLUSTER_NO_PEERS,
    ErrorCode::RAFT_GENERAL,
    ErrorCode::TEMP_STORAGE_FAILED,
];

/// `e` as [`Error::Backend`], retryable as said.
pub(crate) fn backend(retryable: bool, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::backend(BACKEND, retryable, e)
}

/// A JetStream API error as [`Error::Backend`]: retryable for the codes of a cluster
/// without a leader, refused for the rest (a bad request, a missing stream).
pub(crate) fn api(e: async_nats::jetstream::Error) -> Error {
    let retryable = RETRYABLE_CODES.contains(&e.error_code());
    backend(retryable, e)
}

/// A failed publish (or its acknowledgement) as [`Error::Backend`]. Retryable: timeouts,
/// a broken connection, and no responders, which async-nats reports as `StreamNotFound`
/// but which is also what a stream between two leaders answers (the store checked the
/// stream exists when it opened). The write may or may not have happened. Refused: a value
/// over the server's payload limit.
pub(crate) fn publish(e: PublishError) -> Error {
    let retryable = e.kind() != PublishErrorKind::MaxPayloadExceeded;
    backend(retryable, e)
}

/// A failure of the client itself (a timeout, a dropped connection, no responders): the
/// request may be retried.
pub(crate) fn transport(e: impl std::error::Error + Send + Sync + 'static) -> Error {
    backend(true, e)
}

/// A reply the store cannot read (a malformed API answer).
pub(crate) fn unreadable(what: &str) -> Error {
    backend(false, std::io::Error::other(format!("unreadable {what}")))
}
