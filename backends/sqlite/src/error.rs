//! Mapping rusqlite errors onto [`dedup_core::Error`], keeping the driver error as source.
//!
//! Retryable or not is decided by SQLite's result code alone (busy, locked, locking
//! protocol, I/O), never by an error's message text; the tests pin the codes with real
//! errors from the driver.

use std::fmt;
use std::path::Path;

use dedup_core::Error;
use rusqlite::ErrorCode;

/// The backend name in [`Error::Backend`].
pub(crate) const BACKEND: &str = "sqlite";

/// A rusqlite error as [`Error::Backend`], retryable when waiting can help.
pub(crate) fn backend(err: rusqlite::Error) -> Error {
    let retryable = is_transient(&err);
    Error::backend(BACKEND, retryable, err)
}

/// Whether `err` is a lock or I/O condition that a later attempt may not hit: another
/// connection's lock ([`is_lock_conflict`]), an I/O error.
pub(crate) fn is_transient(err: &rusqlite::Error) -> bool {
    err.sqlite_error_code()
        .is_some_and(|code| is_lock_conflict(code) || code == ErrorCode::SystemIoFailure)
}

/// Whether `err` is another connection's lock refusing this one (SQLITE_BUSY,
/// SQLITE_LOCKED, SQLITE_PROTOCOL): the conflict the transactional inbox runs again under
/// the same lease, without using an attempt.
pub(crate) fn is_conflict(err: &rusqlite::Error) -> bool {
    err.sqlite_error_code().is_some_and(is_lock_conflict)
}

/// Whether `err` says another connection holds a lock this operation needs (SQLITE_BUSY,
/// SQLITE_LOCKED, SQLITE_PROTOCOL): the operation changed nothing and can simply run again.
pub(crate) fn is_busy(err: &Error) -> bool {
    let Error::Backend { source, .. } = err else {
        return false;
    };
    source
        .downcast_ref::<rusqlite::Error>()
        .and_then(rusqlite::Error::sqlite_error_code)
        .is_some_and(is_lock_conflict)
}

/// SQLITE_BUSY / SQLITE_LOCKED (another connection or process holds the lock) and
/// SQLITE_PROTOCOL (a WAL locking-protocol hiccup): codes, never message text.
fn is_lock_conflict(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked | ErrorCode::FileLockingProtocolFailed
    )
}

/// A failure to open the database file at `path` as an error that says so, with a hint
/// for the usual mistakes (a folder that does not exist, a file that is not a database).
pub(crate) fn open_error(err: Error, path: &Path) -> Error {
    let code = match &err {
        Error::Backend { source, .. } => source
            .downcast_ref::<rusqlite::Error>()
            .and_then(rusqlite::Error::sqlite_error_code),
        _ => None,
    };
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    let hint = match code {
        Some(ErrorCode::CannotOpen) if parent.is_some_and(|p| !p.is_dir()) => Some(format!(
            "the folder {} does not exist: create it first",
            parent
                .map(Path::display)
                .map(|d| d.to_string())
                .unwrap_or_default()
        )),
        Some(ErrorCode::CannotOpen) if path.is_dir() => {
            Some(format!("{} is a folder, not a file", path.display()))
        }
        Some(ErrorCode::CannotOpen | ErrorCode::ReadOnly | ErrorCode::PermissionDenied) => {
            Some(format!(
                "cannot open or create {}: check that its folder is writable",
                path.display()
            ))
        }
        Some(ErrorCode::NotADatabase) => {
            Some(format!("{} is not an SQLite database file", path.display()))
        }
        _ => None,
    };
    let err = err.during("opening the database file");
    match hint {
        Some(h) => err.with_hint(h),
        None => err,
    }
}

/// A problem with the store's own schema or setup that SQLite did not report as an error.
#[derive(Debug)]
pub(crate) enum SetupError {
    /// The file could not be switched to WAL mode.
    NotWal { mode: String },
    /// The in-memory store's one connection went missing (a panic while it was in use).
    ConnectionLost,
    /// A blocking task failed (panicked or was cancelled at shutdown).
    TaskFailed(tokio::task::JoinError),
    /// Blocking work run in place panicked, with this message.
    Panicked(String),
    /// A queued write got no result: the group it ran in could not get a connection, or
    /// its task failed.
    WriteLost,
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::NotWal { mode } => write!(
                f,
                "could not switch the database to WAL mode (journal_mode is {mode:?}); the \
                 file must be on a local file system that supports shared memory"
            ),
            SetupError::ConnectionLost => {
                write!(f, "the in-memory database's connection was lost")
            }
            SetupError::TaskFailed(e) => write!(f, "blocking SQLite task failed: {e}"),
            SetupError::Panicked(message) => {
                write!(f, "blocking SQLite work panicked: {message}")
            }
            SetupError::WriteLost => write!(
                f,
                "the write was queued but never ran: the transaction it was grouped into \
                 could not get a database connection (see the error of the other writes of \
                 that moment); nothing was written, try again"
            ),
        }
    }
}

impl std::error::Error for SetupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SetupError::TaskFailed(e) => Some(e),
            _ => None,
        }
    }
}

impl From<SetupError> for Error {
    fn from(e: SetupError) -> Self {
        Error::backend(BACKEND, false, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqlite_error(code: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None)
    }

    #[test]
    fn busy_is_retryable_and_keeps_its_source() {
        let err = backend(sqlite_error(rusqlite::ffi::SQLITE_BUSY));
        assert!(err.is_retryable());
        assert!(is_busy(&err));
        let source = std::error::Error::source(&err).expect("source kept");
        assert!(source.downcast_ref::<rusqlite::Error>().is_some());
    }

    /// A real `SQLITE_BUSY` from the driver: another connection holds the write lock
    /// (`BEGIN IMMEDIATE`) and this one does not wait for it (busy timeout 0).
    #[test]
    fn a_real_busy_from_rusqlite_is_retryable_and_busy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("busy.db");
        let holder = rusqlite::Connection::open(&path).unwrap();
        holder
            .execute_batch("PRAGMA journal_mode = WAL; BEGIN IMMEDIATE")
            .unwrap();
        let waiter = rusqlite::Connection::open(&path).unwrap();
        waiter.busy_timeout(std::time::Duration::ZERO).unwrap();
        let err = waiter.execute_batch("BEGIN IMMEDIATE").unwrap_err();
        assert_eq!(
            err.sqlite_error_code(),
            Some(ErrorCode::DatabaseBusy),
            "{err:?}"
        );
        let err = backend(err);
        assert!(err.is_retryable(), "{err:?}");
        assert!(is_busy(&err), "{err:?}");
    }

    /// A real `SQLITE_LOCKED` from the driver: two connections to one shared-cache
    /// database, one writing a table inside a transaction, the other reading it.
    #[test]
    fn a_real_locked_from_rusqlite_is_retryable_and_busy() {
        use rusqlite::OpenFlags;
        let uri = "file:dedup_locked_test?mode=memory&cache=shared";
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_SHARED_CACHE;
        let writer = rusqlite::Connection::open_with_flags(uri, flags).unwrap();
        let reader = rusqlite::Connection::open_with_flags(uri, flags).unwrap();
        writer
            .execute_batch("CREATE TABLE t (x); BEGIN; INSERT INTO t VALUES (1)")
            .unwrap();
        let err = reader
            .query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
            .unwrap_err();
        assert_eq!(
            err.sqlite_error_code(),
            Some(ErrorCode::DatabaseLocked),
            "{err:?}"
        );
        let err = backend(err);
        assert!(err.is_retryable(), "{err:?}");
        assert!(is_busy(&err), "{err:?}");
    }

    /// A real constraint violation from the driver: not retryable, not busy.
    #[test]
    fn a_real_constraint_violation_from_rusqlite_is_not_retryable() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (x PRIMARY KEY); INSERT INTO t VALUES (1)")
            .unwrap();
        let err = conn.execute("INSERT INTO t VALUES (1)", []).unwrap_err();
        assert_eq!(
            err.sqlite_error_code(),
            Some(ErrorCode::ConstraintViolation),
            "{err:?}"
        );
        let err = backend(err);
        assert!(!err.is_retryable(), "{err:?}");
        assert!(!is_busy(&err), "{err:?}");
    }

    #[test]
    fn constraint_is_not_retryable() {
        let err = backend(sqlite_error(rusqlite::ffi::SQLITE_CONSTRAINT));
        assert!(!err.is_retryable());
        assert!(!is_busy(&err));
    }
}
