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
/// dropped: the call may or may not have run, exactly like a lost reply. The text is pinned
/// by a test that has a server cut a reply short (`tests` below).
fn truncated_reply(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Parse && e.to_string().contains("Unexpected end of input")
}

/// Whether the server answered `e` as an error of the command itself (a syntax error, an
/// unknown option, `WRONGTYPE`, an aborted transaction), not of the connection or a
/// transient state: the command did not run, and a retry of it would be refused again.
pub(crate) fn refused(e: &RedisError) -> bool {
    e.code().is_some() && !is_retryable(e)
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

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};

    use dedup_core::{DedupStore, Key};

    use super::*;
    use crate::{RedisConfig, RedisStore};

    /// One command as a client sends it (an array of bulk strings); `None` at the end.
    fn read_command(reader: &mut BufReader<TcpStream>) -> Option<Vec<Vec<u8>>> {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let n: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
        let mut args = Vec::with_capacity(n);
        for _ in 0..n {
            line.clear();
            reader.read_line(&mut line).ok()?;
            let len: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
            let mut arg = vec![0; len + 2];
            reader.read_exact(&mut arg).ok()?;
            arg.truncate(len);
            args.push(arg);
        }
        Some(args)
    }

    /// A server that answers `+OK` to every command (the client's handshake, `INFO`,
    /// `SCRIPT LOAD`) but `EVALSHA`, to which it writes `evalsha_reply` and closes the
    /// connection. Its URL.
    fn server_answering_scripts_with(evalsha_reply: &'static [u8]) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("redis://{}", listener.local_addr().expect("address"));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                std::thread::spawn(move || {
                    let mut writer = stream.try_clone().expect("clone the socket");
                    let mut reader = BufReader::new(stream);
                    while let Some(args) = read_command(&mut reader) {
                        if args
                            .first()
                            .is_some_and(|a| a.eq_ignore_ascii_case(b"EVALSHA"))
                        {
                            let _ = writer.write_all(evalsha_reply);
                            let _ = writer.flush();
                            let _ = writer.shutdown(Shutdown::Both);
                            return;
                        }
                        if writer.write_all(b"+OK\r\n").is_err() {
                            return;
                        }
                    }
                });
            }
        });
        url
    }

    /// What a store's `get` fails with when the server writes `reply` to its script call
    /// and closes the connection: the error, and the driver error under it.
    async fn get_error(reply: &'static [u8]) -> (Error, RedisError) {
        let url = server_answering_scripts_with(reply);
        let store = RedisStore::connect_with(&url, RedisConfig::default())
            .await
            .expect("connect to the fake server");
        let error = store
            .get(&Key::new("c", "m").unwrap())
            .await
            .expect_err("a reply cut short");
        let driver = match &error {
            Error::Backend { source, .. } => source
                .downcast_ref::<RedisError>()
                .unwrap_or_else(|| panic!("not a redis-rs error: {error:?}"))
                .clone(),
            other => panic!("not a backend error: {other:?}"),
        };
        (error, driver)
    }

    /// The connection closing in the middle of a reply (here a bulk string of 10 bytes of
    /// which 3 came): redis-rs's codec reports a parse error, "Unexpected end of input", not
    /// an I/O error. Pinned here through the store's own path so that a redis-rs that words
    /// it otherwise fails this test (and `truncated_reply` is updated) instead of the
    /// error silently turning non-retryable.
    #[tokio::test]
    async fn a_reply_cut_short_by_the_connection_closing_is_retryable() {
        let (error, driver) = get_error(b"$10\r\nabc").await;
        assert_eq!(driver.kind(), ErrorKind::Parse, "{driver:?}");
        assert!(
            driver.to_string().contains("Unexpected end of input"),
            "{driver}"
        );
        assert!(truncated_reply(&driver), "{driver:?}");
        assert!(error.is_retryable(), "{error:?}");
    }

    /// A reply that is garbage, not cut short, is a parse error of another text: not
    /// retryable (the same call would get the same reply).
    #[tokio::test]
    async fn a_garbage_reply_is_not_retryable() {
        let (error, driver) = get_error(b"?garbage\r\n").await;
        assert_eq!(driver.kind(), ErrorKind::Parse, "{driver:?}");
        assert!(!truncated_reply(&driver), "{driver:?}");
        assert!(!error.is_retryable(), "{error:?}");
    }
}
