//! Turning redis-rs errors and replication shortfalls into [`dedup_core::Error`].

use std::fmt;

use dedup_core::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// The backend name in [`Error::Backend`].
pub(crate) const BACKEND: &str = "redis";

/// A driver error as [`Error::Backend`], the driver error kept as `source`.
///
/// Retryable: I/O errors (connection dropped or refused, timeouts), cluster redirections
/// and transient cluster states (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`,
/// a missing node connection), a server still loading its data set (`LOADING`), a write
/// that reached a demoted primary (`READONLY`), a busy server (`BUSY`) and a reply cut
/// short by the connection dropping.
pub(crate) fn backend(e: RedisError) -> Error {
    let retryable = is_retryable(&e);
    Error::backend(BACKEND, retryable, e)
}

pub(crate) fn is_retryable(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                )
        )
        || e.code() == Some("BUSY")
        || truncated_reply(e)
}

/// A reply cut short by the connection closing. redis-rs's async codec reports it as a
/// parse error ("Unexpected end of input") instead of an I/O error, but the connection
/// dropped: the call may or may not have run, exactly like a lost reply.
fn truncated_reply(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Parse && e.to_string().contains("Unexpected end of input")
}

/// Whether `e` says the server does not know the script (`NOSCRIPT`).
pub(crate) fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// The source of the retryable [`Error::Backend`] returned when
/// [`RedisConfig::wait_for_replicas`](crate::RedisConfig::wait_for_replicas) is set and fewer
/// replicas than asked acknowledged a commit within the timeout.
///
/// The commit **has happened** on the primary; it is just not known to be on enough
/// replicas. Retrying the same commit with the same lease is safe (a commit by the same
/// token is `Ok` and changes nothing) and waits again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicationShortfall {
    /// Replicas asked for.
    pub wanted: u32,
    /// Replicas that acknowledged within the timeout (the smallest count over the nodes
    /// involved, in cluster mode).
    pub acknowledged: u32,
}

impl fmt::Display for ReplicationShortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "commit applied on the primary but acknowledged by {} of {} replicas in time",
            self.acknowledged, self.wanted
        )
    }
}

impl std::error::Error for ReplicationShortfall {}

impl ReplicationShortfall {
    pub(crate) fn into_error(self) -> Error {
        Error::backend(BACKEND, true, self)
    }
}
