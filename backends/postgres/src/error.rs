//! Mapping driver errors onto [`dedup_core::Error`].

use dedup_core::Error;
use dedup_sql::SqlBackend;

/// The backend name in [`Error::Backend`].
pub(crate) const BACKEND: &str = "postgres";

/// A driver error as [`Error::Backend`], keeping it as the source and saying whether a
/// retry can help (a pool timeout carries [`dedup_sql::error::POOL_TIMED_OUT_HINT`]).
pub(crate) fn backend(error: sqlx::Error) -> Error {
    Backend::error(error)
}

/// PostgreSQL as `dedup-sql`'s shared layer sees it (its dialects are implemented on it).
#[derive(Debug)]
pub struct Backend;

impl SqlBackend for Backend {
    type Db = sqlx::Postgres;
    const NAME: &'static str = BACKEND;

    /// The server restarting or resolving a conflict by aborting us (serialization
    /// failure, deadlock, lock timeout).
    fn rows_affected(result: &sqlx::postgres::PgQueryResult) -> u64 {
        result.rows_affected()
    }

    /// A serialization failure (`40001`), a deadlock (`40P01`), a lock timeout (`55P03`).
    fn is_conflict(error: &sqlx::Error) -> bool {
        match error {
            sqlx::Error::Database(db) => db.code().is_some_and(|code| conflict_sqlstate(&code)),
            _ => false,
        }
    }

    fn server_asks_retry(error: &sqlx::Error) -> bool {
        match error {
            sqlx::Error::Database(db) => db.code().is_some_and(|code| retryable_sqlstate(&code)),
            sqlx::Error::Protocol(message) => cut_during_tls_negotiation(message),
            _ => false,
        }
    }
}

/// Tries of one statement that keeps meeting rows moved under it ([`row_moved`]).
pub(crate) const MOVED_TRIES: usize = 5;

/// The statement met a row that a concurrent update moved to another partition (the
/// partitioned layout moves a row to the current window's partition on every write):
/// PostgreSQL refuses it with `40001` instead of following the row. Run again, the
/// statement sees the row where it is now. The plain layout never moves rows.
pub(crate) fn row_moved(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => {
            db.code().as_deref() == Some("40001")
                && db.message().contains("moved to another partition")
        }
        _ => false,
    }
}

/// Run the statement `run` makes, again while it meets a moved row ([`row_moved`]), at
/// most [`MOVED_TRIES`] times.
pub(crate) async fn again_if_moved<T, F, Fut>(mut run: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let mut tries = 1;
    loop {
        match run().await {
            Err(e) if row_moved(&e) && tries < MOVED_TRIES => tries += 1,
            other => return other,
        }
    }
}

/// PostgreSQL refused a lock: asked with `NOWAIT`, or past `lock_timeout` (`55P03`).
pub(crate) fn lock_not_available(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => db.code().as_deref() == Some("55P03"),
        _ => false,
    }
}

/// sqlx reports a connection closed before the server answered the TLS negotiation
/// (`SSLRequest`) as a protocol error about a 0x00 answer byte (it read nothing), not as
/// an I/O error. The connection dropped; another attempt can succeed. Any other answer
/// byte (a server that is not PostgreSQL) stays a permanent error. `tests/tls_negotiation.rs`
/// makes sqlx produce both and pins this text and the classification.
pub(crate) fn cut_during_tls_negotiation(message: &str) -> bool {
    message.starts_with("unexpected response from SSLRequest: 0x00")
}

/// SQLSTATEs of a transaction refused over a conflict with a concurrent one.
fn conflict_sqlstate(code: &str) -> bool {
    matches!(
        code,
        "40001" // serialization_failure
            | "40P01" // deadlock_detected
            | "55P03" // lock_not_available (lock_timeout)
    )
}

/// SQLSTATEs worth retrying.
fn retryable_sqlstate(code: &str) -> bool {
    // Class 08: connection exceptions.
    code.starts_with("08")
        || conflict_sqlstate(code)
        || matches!(
            code,
            "57P01" // admin_shutdown (also pg_terminate_backend)
                | "57P02" // crash_shutdown
                | "57P03" // cannot_connect_now (starting up / shutting down)
                | "53300" // too_many_connections
        )
}

/// A transient contract-level failure of our own (an operation kept racing concurrent
/// writers): retryable, with a message as source.
pub(crate) fn raced(what: &'static str) -> Error {
    dedup_sql::error::raced(BACKEND, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates() {
        for code in ["08006", "08001", "40001", "40P01", "57P01", "53300"] {
            assert!(retryable_sqlstate(code), "{code}");
        }
        for code in ["23505", "42P01", "22003", "25P02"] {
            assert!(!retryable_sqlstate(code), "{code}");
        }
        for code in ["40001", "40P01", "55P03"] {
            assert!(conflict_sqlstate(code), "{code}");
        }
        for code in ["08006", "57P01", "53300", "23505"] {
            assert!(!conflict_sqlstate(code), "{code}");
        }
    }

    #[test]
    fn driver_errors_other_than_connection_failures_are_final() {
        for error in [sqlx::Error::RowNotFound, sqlx::Error::PoolClosed] {
            assert!(!Backend::server_asks_retry(&error), "{error}");
            assert!(!backend(error).is_retryable());
        }
    }
}
