//! Connections: opening a database file or an in-memory database with the store's settings
//! (WAL, `synchronous`, the busy wait), the store's small pool of connections, and
//! retrying an operation that found another connection's lock ([`retry_busy`]).
//!
//! Every SQLite call blocks, so the store only touches connections where blocking is
//! allowed ([`crate::blocking`]); the pool's semaphore bounds how many run at once, and a
//! connection is checked out by exactly one caller at a time.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use dedup_core::Result;
use rusqlite::Connection;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{SqliteConfig, Synchronous};
use crate::error::{SetupError, backend, is_busy};

/// How long the busy handler of the store's pooled connections waits before [`retry_busy`]
/// takes over.
///
/// SQLite's default handler sleeps 1, 2, 5, 10, ... up to 100 ms between looks at the lock,
/// so under steady write traffic a waiting process mostly sleeps through the short gaps
/// between other writers' transactions (another process's purge batches, its claims) and
/// can starve until its timeout. The store's connections look at the lock every
/// [`POLL_INTERVAL`] instead, for about this long, and then the store retries the whole
/// (rolled back) transaction itself until the configured busy timeout.
const POLL_WAIT: Duration = Duration::from_millis(5);

/// How often a pooled connection waiting for another connection's lock looks again: a
/// lock held for a fraction of a millisecond (a paced purge batch) delays a claim by about
/// that long, not by a whole millisecond sleep.
const POLL_INTERVAL: Duration = Duration::from_micros(100);

/// The busy handler of the store's pooled connections: wait [`POLL_INTERVAL`] and look
/// again, for about [`POLL_WAIT`] in all.
fn poll_lock(tries: i32) -> bool {
    const TRIES: u128 = POLL_WAIT.as_micros() / POLL_INTERVAL.as_micros();
    if u128::try_from(tries).unwrap_or(u128::MAX) >= TRIES {
        return false;
    }
    thread::sleep(POLL_INTERVAL);
    true
}

/// How long the write-ahead log of the store's pooled connections gets (pages) before the
/// commit that passes it copies the log back into the database file (a checkpoint; SQLite's
/// default is 1 000).
///
/// That commit holds the write lock while it copies and syncs, and every write queued
/// behind it waits. With a million records the copied pages lie all over the file, and a
/// 1 000-page checkpoint is most of a claim's p99; checkpoints of 100 pages come ten times
/// as often and each holds the writes back about a tenth as long, for a little more CPU
/// per commit at one stream (BENCHMARKS.md, Scale).
///
/// A checkpoint on a thread of its own was tried twice and dropped (the figures are in the
/// commits that say so). Under a steady stream of commits, a passive checkpoint never
/// finds the log wholly copied. So the log starts over only if the thread also holds the
/// writes back while it copies the rest, and that hold made a claim's p99 at a million
/// records worse than these checkpoints do. Connections handed to the caller and other
/// processes keep SQLite's default.
pub(crate) const CHECKPOINT_PAGES: u32 = 100;

/// Pause between two tries of [`retry_busy`].
const RETRY_PAUSE: Duration = Duration::from_millis(1);

/// Which busy wait a connection gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// The store's pooled connections: a short wait looking at the lock often
    /// ([`POLL_INTERVAL`]), the store's [`retry_busy`] loop around every operation.
    Poll,
    /// A connection handed to the caller: SQLite's busy handler waits the whole busy
    /// timeout, since nothing retries the caller's transaction for it.
    Full,
}

/// Where the database lives.
#[derive(Clone, Debug)]
pub(crate) enum Location {
    /// A database file (WAL mode, shareable with other connections and processes).
    File(PathBuf),
    /// A private in-memory database on one connection.
    Memory,
}

/// The settings every connection of a store is opened with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnectionSettings {
    pub(crate) synchronous: Synchronous,
    pub(crate) busy_timeout: Duration,
}

impl ConnectionSettings {
    pub(crate) fn of(config: &SqliteConfig) -> Self {
        ConnectionSettings {
            synchronous: config.synchronous,
            busy_timeout: config.busy_timeout,
        }
    }

    /// Open a connection to the file at `path`: WAL, synchronous, and the busy wait of
    /// `wait` (the store's own connections, [`Wait::Poll`], also checkpoint every
    /// [`CHECKPOINT_PAGES`]). Retries while another process holds a lock the
    /// setup needs (switching to WAL), within the configured busy timeout. Blocking.
    pub(crate) fn open_file(&self, path: &Path, wait: Wait) -> Result<Connection> {
        retry_busy(self.busy_timeout, || {
            let conn = Connection::open(path).map_err(backend)?;
            match wait {
                Wait::Poll if self.busy_timeout >= POLL_WAIT => {
                    conn.busy_handler(Some(poll_lock)).map_err(backend)?;
                }
                Wait::Poll => conn.busy_timeout(self.busy_timeout).map_err(backend)?,
                Wait::Full => conn.busy_timeout(self.busy_timeout).map_err(backend)?,
            }
            let mode: String = conn
                .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
                .map_err(backend)?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(SetupError::NotWal { mode }.into());
            }
            if wait == Wait::Poll {
                conn.pragma_update(None, "wal_autocheckpoint", CHECKPOINT_PAGES)
                    .map_err(backend)?;
            }
            self.finish(conn)
        })
    }

    /// Open a private in-memory database. Blocking (briefly).
    pub(crate) fn open_memory(&self) -> Result<Connection> {
        let conn = Connection::open_in_memory().map_err(backend)?;
        self.finish(conn)
    }

    fn finish(&self, conn: Connection) -> Result<Connection> {
        conn.pragma_update(None, "synchronous", self.synchronous.pragma())
            .map_err(backend)?;
        conn.set_prepared_statement_cache_capacity(32);
        Ok(conn)
    }
}

/// Run `op` again while it fails because another connection holds a lock (SQLITE_BUSY /
/// LOCKED / PROTOCOL), until `timeout` has passed since the first try (so a busy
/// operation fails after the whole timeout, a few milliseconds more at most); then the last
/// (retryable) error is returned. Each try is a whole transaction that rolled back on the
/// error, so running it again is safe. Blocking: call only on a blocking thread.
pub(crate) fn retry_busy<T>(timeout: Duration, mut op: impl FnMut() -> Result<T>) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let result = op();
        let left = deadline.saturating_duration_since(Instant::now());
        match result {
            Err(e) if is_busy(&e) && !left.is_zero() => thread::sleep(left.min(RETRY_PAUSE)),
            result => return result,
        }
    }
}

/// The connections of one store.
#[derive(Debug)]
pub(crate) struct Pool {
    pub(crate) location: Location,
    pub(crate) settings: ConnectionSettings,
    idle: Mutex<Vec<Connection>>,
    permits: Arc<Semaphore>,
}

impl Pool {
    /// A pool holding `first` (already open and migrated), allowing `size` connections
    /// (one for an in-memory database, whose data lives in that one connection).
    pub(crate) fn new(
        location: Location,
        settings: ConnectionSettings,
        first: Connection,
        size: usize,
    ) -> Self {
        let size = match location {
            Location::File(_) => size,
            Location::Memory => 1,
        };
        Pool {
            location,
            settings,
            idle: Mutex::new(vec![first]),
            permits: Arc::new(Semaphore::new(size)),
        }
    }

    /// Wait (asynchronously) for the right to use one connection.
    pub(crate) async fn permit(&self) -> OwnedSemaphorePermit {
        // The semaphore is never closed.
        match self.permits.clone().acquire_owned().await {
            Ok(permit) => permit,
            Err(_) => unreachable!("the pool's semaphore is never closed"),
        }
    }

    /// Run `op` on a connection: an idle one, or a new one while the pool is below its
    /// size. The caller holds a permit. Blocking.
    pub(crate) fn with_connection<T>(&self, op: impl FnOnce(&mut Connection) -> T) -> Result<T> {
        let idle = self.idle().pop();
        let mut conn = match (idle, &self.location) {
            (Some(conn), _) => conn,
            (None, Location::File(path)) => self.settings.open_file(path, Wait::Poll)?,
            (None, Location::Memory) => return Err(SetupError::ConnectionLost.into()),
        };
        let out = op(&mut conn);
        self.check_in(conn);
        Ok(out)
    }

    /// Return `conn` to the pool, unless it is stuck inside a transaction it cannot leave
    /// (then a file connection is closed; the in-memory one is kept, it holds the data).
    fn check_in(&self, conn: Connection) {
        let usable = conn.is_autocommit()
            || (conn.execute_batch("ROLLBACK").is_ok() && conn.is_autocommit());
        if usable || matches!(self.location, Location::Memory) {
            self.idle().push(conn);
        }
    }

    fn idle(&self) -> MutexGuard<'_, Vec<Connection>> {
        // Only push and pop happen under this lock: a panic cannot leave it inconsistent.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Pool {
    /// Closing the last connection to a WAL database checkpoints it and removes the WAL
    /// file: file I/O, so inside a tokio runtime it happens on a blocking thread rather
    /// than on whichever executor thread dropped the last store handle.
    fn drop(&mut self) {
        let connections = std::mem::take(&mut *self.idle());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            drop(runtime.spawn_blocking(move || drop(connections)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dedup_core::Error;

    #[test]
    fn a_pooled_connection_looks_at_a_held_lock_every_poll_interval_for_about_poll_wait() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("poll.db");
        let settings = ConnectionSettings {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(5),
        };
        let holder = settings.open_file(&path, Wait::Full).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let waiter = settings.open_file(&path, Wait::Poll).unwrap();
        let started = Instant::now();
        let err = waiter.execute_batch("BEGIN IMMEDIATE").unwrap_err();
        let waited = started.elapsed();
        assert!(is_busy(&backend(err)));
        // SQLite's own handler would have slept 1 + 2 ms and given up at 5 ms; ours looks
        // 50 times, 100 µs apart (the sleeps only ever overrun).
        assert!(waited >= POLL_WAIT, "{waited:?}");
        assert!(waited < POLL_WAIT * 20, "{waited:?}");
        let tries = (0..).take_while(|&n| poll_lock(n)).count();
        assert_eq!(tries, 50);
    }

    /// A pooled connection's commits copy the log into the database file once it passes
    /// [`CHECKPOINT_PAGES`]: the file holds the pages at once, although the log stayed far
    /// below SQLite's default of 1 000 pages and no connection closed. A caller's
    /// connection keeps the default (its commits leave the file as it was).
    #[test]
    fn a_pooled_connection_checkpoints_every_checkpoint_pages_a_callers_at_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let settings = ConnectionSettings {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(5),
        };
        let pages = u64::from(CHECKPOINT_PAGES);
        for (wait, checkpoints) in [(Wait::Poll, true), (Wait::Full, false)] {
            let path = dir.path().join(format!("{wait:?}.db"));
            let conn = settings.open_file(&path, wait).unwrap();
            conn.execute_batch("CREATE TABLE filler (page BLOB)")
                .unwrap();
            let before = std::fs::metadata(&path).unwrap().len();
            // One commit each, about a 4 KiB page each: twice the pooled threshold.
            for _ in 0..2 * pages {
                conn.execute("INSERT INTO filler VALUES (zeroblob(4000))", [])
                    .unwrap();
            }
            let after = std::fs::metadata(&path).unwrap().len();
            assert_eq!(
                after >= before + pages * 4000,
                checkpoints,
                "{wait:?}: the database file went from {before} to {after} bytes after {} commits",
                2 * pages
            );
        }
    }

    #[test]
    fn retry_busy_retries_busy_errors_until_success() {
        let mut tries = 0;
        let out = retry_busy(Duration::from_secs(5), || {
            tries += 1;
            if tries < 3 {
                Err(backend(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                    None,
                )))
            } else {
                Ok(tries)
            }
        });
        assert_eq!(out.unwrap(), 3);
    }

    #[test]
    fn retry_busy_gives_up_at_the_timeout_and_never_retries_other_errors() {
        let started = Instant::now();
        let err = retry_busy(Duration::from_millis(30), || -> Result<()> {
            Err(backend(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                None,
            )))
        })
        .unwrap_err();
        assert!(err.is_retryable());
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(30) && waited < Duration::from_secs(2),
            "{waited:?}"
        );

        let mut tries = 0;
        let err = retry_busy(Duration::from_secs(5), || -> Result<()> {
            tries += 1;
            Err(Error::invalid("x", "no"))
        })
        .unwrap_err();
        assert!(err.is_invalid_input());
        assert_eq!(tries, 1);
    }
}
