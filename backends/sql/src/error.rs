//! Driver errors as [`dedup_core::Error`]: what every sqlx backend says the same way (a
//! pool timeout's hint, the connection failures worth retrying). Which server error codes
//! are retryable is each backend's.

use dedup_core::Error;

use sqlx::Database;

use crate::query::SqlDb;

/// A row of backend `B`'s database.
pub type RowOf<B> = <<B as SqlBackend>::Db as Database>::Row;

/// One sqlx backend as the shared layer sees it: its database, its name in errors and
/// metrics, and which driver errors ask for a retry. Each backend crate implements it once,
/// and its other dialects ([`ConnectDialect`](crate::connect::ConnectDialect),
/// [`TxStore`](crate::TxStore)) build on it.
pub trait SqlBackend: Send + Sync + 'static {
    /// The sqlx database.
    type Db: SqlDb;

    /// The backend name in [`Error::Backend`] and the metrics' backend label (`postgres`,
    /// `mysql`).
    const NAME: &'static str;

    /// Whether this server asks to run the operation again for `error`: what only it
    /// reports (its error codes for a deadlock or a serialization failure, its way of
    /// closing a connection). The driver's own connection failures are decided once, in
    /// [`is_retryable`](Self::is_retryable).
    fn server_asks_retry(error: &sqlx::Error) -> bool;

    /// Whether `error` is this server refusing a transaction over a conflict with a
    /// concurrent one: a deadlock, a serialization failure, a lock wait timeout. Each is
    /// also one the server [asks to retry](Self::server_asks_retry); the transactional
    /// inbox runs such a transaction again under the same lease, without using an attempt
    /// ([`TxEngine`](dedup_core::TxEngine)). The default: none.
    fn is_conflict(error: &sqlx::Error) -> bool {
        let _ = error;
        false
    }

    /// How many rows a statement changed, from its driver's result.
    fn rows_affected(result: &<Self::Db as Database>::QueryResult) -> u64;

    /// Whether the operation should run again for `error`: a connection failure
    /// ([`is_connection_failure`]) or what [`server_asks_retry`](Self::server_asks_retry).
    fn is_retryable(error: &sqlx::Error) -> bool {
        is_connection_failure(error) || Self::server_asks_retry(error)
    }

    /// `error` as [`Error::Backend`], its source kept ([`backend`]).
    fn error(error: sqlx::Error) -> Error {
        backend(Self::NAME, Self::is_retryable(&error), error)
    }
}

/// What [`backend`] adds to a pool timeout: why no connection came, and what to check.
pub const POOL_TIMED_OUT_HINT: &str = "no pool connection became free or could be \
    opened within acquire_timeout: the database may be down, slow or out of connections, or \
    pool_size is below the work in flight (see the crate docs on pool sizing)";

/// A driver error as [`Error::Backend`] of backend `name`, keeping it as the source, with
/// `retryable` as the backend decided it and [`POOL_TIMED_OUT_HINT`] on a pool timeout.
pub fn backend(name: &'static str, retryable: bool, error: sqlx::Error) -> Error {
    let timed_out = matches!(error, sqlx::Error::PoolTimedOut);
    let error = Error::backend(name, retryable, error);
    if timed_out {
        return error.with_hint(POOL_TIMED_OUT_HINT);
    }
    error
}

/// The driver's own transient failures, the same on every server: the connection's I/O,
/// no pool connection in time, the driver's worker gone.
pub fn is_connection_failure(error: &sqlx::Error) -> bool {
    matches!(
        error,
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::WorkerCrashed
    )
}

/// A transient contract-level failure of backend `name`'s own (an operation kept racing
/// concurrent writers): retryable, with a message as source.
pub fn raced(name: &'static str, what: &'static str) -> Error {
    Error::backend(
        name,
        true,
        format!("{what}: the record kept changing under concurrent writers; try again"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_timeout_gets_the_hint_and_keeps_its_source() {
        let e = backend("test", true, sqlx::Error::PoolTimedOut);
        assert!(e.is_retryable());
        assert!(e.to_string().contains("acquire_timeout"), "{e}");
        assert!(std::error::Error::source(&e).is_some(), "source kept");
        let other = backend("test", false, sqlx::Error::RowNotFound);
        assert!(!other.is_retryable());
        assert!(!other.to_string().contains("acquire_timeout"), "{other}");
    }

    #[test]
    fn a_race_is_retryable_and_says_what_raced() {
        let e = raced("test", "claim");
        assert!(e.is_retryable());
        let source = std::error::Error::source(&e).expect("a message as source");
        assert!(
            source
                .to_string()
                .contains("claim: the record kept changing"),
            "{source}"
        );
    }

    /// A backend whose server never asks for a retry: what is retryable is the layer's.
    struct NoServerRetry;

    impl SqlBackend for NoServerRetry {
        type Db = sqlx::Postgres;
        const NAME: &'static str = "test";

        fn server_asks_retry(_: &sqlx::Error) -> bool {
            false
        }

        fn rows_affected(result: &sqlx::postgres::PgQueryResult) -> u64 {
            result.rows_affected()
        }
    }

    #[test]
    fn a_backends_connection_failures_are_retryable_and_keep_their_source() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        let e = NoServerRetry::error(io);
        assert!(e.is_retryable());
        assert!(std::error::Error::source(&e).is_some(), "source kept");
        assert!(NoServerRetry::error(sqlx::Error::PoolTimedOut).is_retryable());
        assert!(!NoServerRetry::error(sqlx::Error::RowNotFound).is_retryable());
        assert!(!NoServerRetry::error(sqlx::Error::PoolClosed).is_retryable());
    }

    #[test]
    fn connection_failures() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(is_connection_failure(&io));
        assert!(is_connection_failure(&sqlx::Error::PoolTimedOut));
        assert!(!is_connection_failure(&sqlx::Error::RowNotFound));
    }
}
