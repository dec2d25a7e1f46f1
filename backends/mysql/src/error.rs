//! Mapping driver errors onto [`dedup_core::Error`].

use dedup_core::Error;
use dedup_sql::SqlBackend;
use sqlx::mysql::MySqlDatabaseError;

/// The backend name in [`Error::Backend`].
pub(crate) const BACKEND: &str = "mysql";

/// A driver error as [`Error::Backend`], keeping it as the source and saying whether a
/// retry can help (a pool timeout carries [`dedup_sql::error::POOL_TIMED_OUT_HINT`]).
pub(crate) fn backend(error: sqlx::Error) -> Error {
    Backend::error(error)
}

/// MySQL / MariaDB as `dedup-sql`'s shared layer sees it (its dialects are implemented on it).
#[derive(Debug)]
pub struct Backend;

impl SqlBackend for Backend {
    type Db = sqlx::MySql;
    const NAME: &'static str = BACKEND;

    /// The server going away or resolving a conflict by refusing us (deadlock, lock wait
    /// timeout, `NOWAIT`).
    fn rows_affected(result: &sqlx::mysql::MySqlQueryResult) -> u64 {
        result.rows_affected()
    }

    /// A deadlock (1213), a lock wait timeout (1205, and MariaDB's `NOWAIT`), MySQL 8's
    /// `NOWAIT` (3572). On a Galera cluster a write set that failed certification (a
    /// concurrent write to the same rows through another node) is a 1213 at `COMMIT`.
    fn is_conflict(error: &sqlx::Error) -> bool {
        error_number(error).is_some_and(conflict_number)
    }

    fn server_asks_retry(error: &sqlx::Error) -> bool {
        match error {
            sqlx::Error::Database(db) => {
                error_number(error).is_some_and(retryable_number)
                    || db.code().is_some_and(|code| code.starts_with("08"))
            }
            _ => false,
        }
    }
}

/// The server's error number, when `error` is one the server sent.
pub(crate) fn error_number(error: &sqlx::Error) -> Option<u16> {
    match error {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number),
        _ => None,
    }
}

/// Server error numbers of a transaction refused over a conflict with a concurrent one.
fn conflict_number(number: u16) -> bool {
    matches!(
        number,
        1205 // ER_LOCK_WAIT_TIMEOUT (MariaDB's NOWAIT too)
            | 1213 // ER_LOCK_DEADLOCK: the transaction was rolled back
            | 3572 // ER_LOCK_NOWAIT (MySQL 8)
    )
}

/// Server error numbers worth retrying.
fn retryable_number(number: u16) -> bool {
    conflict_number(number)
        || matches!(
            number,
            1040 // ER_CON_COUNT_ERROR: too many connections
            | 1047 // Galera: "WSREP has not yet prepared node for application use"
            | 1053 // ER_SERVER_SHUTDOWN
            | 1180 // ER_ERROR_DURING_COMMIT (rolled back): Galera out of the primary component
            | 1927 // ER_CONNECTION_KILLED (MariaDB)
            | 4031 // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8: idle connection closed)
        )
}

/// A statement of our own transaction that lost a race with a concurrent writer and may
/// simply run again: a duplicate key (a concurrent insert of a key our locking read found
/// absent), a deadlock, a lock wait timeout.
pub(crate) fn lost_race(error: &sqlx::Error) -> bool {
    matches!(error_number(error), Some(1062 | 1213 | 1205))
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
    fn numbers() {
        for n in [1205, 1213, 3572, 1040, 1047, 1053, 1180, 1927] {
            assert!(retryable_number(n), "{n}");
        }
        for n in [1062, 1146, 1064, 1406] {
            assert!(!retryable_number(n), "{n}");
        }
        for n in [1205, 1213, 3572] {
            assert!(conflict_number(n), "{n}");
        }
        for n in [1040, 1047, 1053, 1180, 1927, 1062] {
            assert!(!conflict_number(n), "{n}");
        }
    }

    #[test]
    fn only_the_servers_refusals_ask_for_a_retry() {
        assert!(!Backend::server_asks_retry(&sqlx::Error::RowNotFound));
        assert!(!backend(sqlx::Error::RowNotFound).is_retryable());
        assert!(backend(sqlx::Error::PoolTimedOut).is_retryable());
    }
}
