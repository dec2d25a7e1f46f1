//! The write queue: this store's writes run in arrival order, and concurrent ones share one
//! transaction (group commit).
//!
//! SQLite runs one writer at a time, and with `synchronous = FULL` each transaction's commit
//! waits for the disk. A write therefore joins a queue and then waits for the store's gate (a
//! first-come, first-served lock). Whoever gets the gate takes every write queued so far (up
//! to [`MAX_GROUP`]) and runs them, in queue order, in one `BEGIN IMMEDIATE` transaction with
//! one commit; each write's caller gets its own result once that commit is durable. A write
//! whose caller got there first finds its result waiting and never needs the gate.
//!
//! What a group changes for the callers: nothing they can observe, except speed. Each write
//! reads "now" when its turn in the transaction comes and sees every earlier write of the
//! group, exactly as if each had committed alone in the same order. A write that fails (a
//! storage error, or a contract error a write reports as `Err`, such as renewing a lost
//! lease) makes the group roll back; every write of the group then runs again alone, in
//! order, in its own transaction, so one failure never decides another write's result.
//! A caller that gives up while its write is still queued (its future dropped) takes the
//! write out: it never runs.
//!
//! Dependencies point one way: the store owns a [`WriteQueue`] and this module knows
//! nothing of the store. A write gets the owner's context (the store's state) as an
//! argument when it runs, and the owner says how a [`Group`] reaches a connection
//! (`SqliteStore::write` in `store.rs`). Purge batches use the gate and [`in_transaction`]
//! but never join a group.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dedup_core::{Clock, Error, Result, Timestamp};
use rusqlite::Connection;
use tokio::sync::{OwnedMutexGuard, oneshot};

use crate::connect::retry_busy;
use crate::error::{SetupError, backend};

/// The most writes one transaction takes: bounds how long a group holds SQLite's write lock
/// (and so how long a purge batch or another process waits behind it).
pub(crate) const MAX_GROUP: usize = 64;

/// One write operation, as the store's methods pass it: run inside an open transaction,
/// with the owner's context `C` (the store's state) and that write's "now".
pub(crate) trait WriteOp<C, T>:
    FnMut(&Connection, &C, Timestamp) -> Result<T> + Send + 'static
{
}
impl<C, T, F> WriteOp<C, T> for F where
    F: FnMut(&Connection, &C, Timestamp) -> Result<T> + Send + 'static
{
}

/// A queued write, its result type erased.
trait Job<C>: Send {
    /// Run the write inside `conn`'s open transaction, keeping its output for later.
    fn run(&mut self, conn: &Connection, context: &C, now: Timestamp) -> Result<()>;
    /// The transaction committed: hand the caller the kept output.
    fn succeed(self: Box<Self>);
    /// The write failed for good: hand the caller `error`.
    fn fail(self: Box<Self>, error: Error);
    /// The caller stopped waiting: do not run it.
    fn abandoned(&self) -> bool;
}

struct Pending<T, F> {
    op: F,
    output: Option<T>,
    reply: oneshot::Sender<Result<T>>,
}

impl<C, T: Send + 'static, F: WriteOp<C, T>> Job<C> for Pending<T, F> {
    fn run(&mut self, conn: &Connection, context: &C, now: Timestamp) -> Result<()> {
        self.output = Some((self.op)(conn, context, now)?);
        Ok(())
    }

    fn succeed(self: Box<Self>) {
        let result = self.output.ok_or_else(|| SetupError::WriteLost.into());
        // A caller that stopped waiting gets nothing: the write is done all the same.
        let _ = self.reply.send(result);
    }

    fn fail(self: Box<Self>, error: Error) {
        let _ = self.reply.send(Err(error));
    }

    fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }
}

/// A queue of writes and the gate their groups take turns at. It knows nothing of the
/// store that owns it: the writes get the owner's context `C` when they run, and the owner
/// says how a group reaches a connection (see [`write`](Self::write)).
pub(crate) struct WriteQueue<C> {
    /// Held for a group's whole transaction; first come, first served (tokio's mutex is
    /// fair), so the owner's writers never poll SQLite's lock against each other. The
    /// owner's other writers (purge batches) take it too.
    gate: Arc<tokio::sync::Mutex<()>>,
    queued: Mutex<Vec<Box<dyn Job<C>>>>,
}

impl<C> Default for WriteQueue<C> {
    fn default() -> Self {
        WriteQueue {
            gate: Arc::default(),
            queued: Mutex::default(),
        }
    }
}

impl<C> WriteQueue<C> {
    /// Wait (asynchronously) for the gate, for a write that does not join a group.
    pub(crate) async fn gate(&self) -> OwnedMutexGuard<()> {
        Arc::clone(&self.gate).lock_owned().await
    }

    /// Queue `op` to run inside a `BEGIN IMMEDIATE` transaction (possibly shared with other
    /// queued writes, see the module docs), with "now" read when its turn comes; its result
    /// is returned once the transaction committed. `op` may run more than once (after a
    /// busy lock or a group's rollback): each run starts from a rolled-back state.
    ///
    /// Whenever this caller gets the gate while writes are queued, it takes them as a
    /// [`Group`] and hands it, with the gate, to `run_group`, which must hold the gate and
    /// [`Group::run`] the group on a connection. Its error (no connection) fails the whole
    /// group: each of its writers gets [`SetupError::WriteLost`], this one the error.
    pub(crate) async fn write<T, Run>(
        &self,
        op: impl WriteOp<C, T>,
        mut run_group: impl FnMut(OwnedMutexGuard<()>, Group<C>) -> Run,
    ) -> Result<T>
    where
        C: 'static,
        T: Send + 'static,
        Run: Future<Output = Result<()>>,
    {
        let (reply, mut result) = oneshot::channel();
        self.push(Box::new(Pending {
            op,
            output: None,
            reply,
        }));
        loop {
            tokio::select! {
                biased;
                done = &mut result => {
                    return done.unwrap_or_else(|_| Err(SetupError::WriteLost.into()));
                }
                gate = self.gate() => {
                    let group = self.take_group();
                    if group.0.is_empty() {
                        // Ours ran in an earlier group: its result is already sent.
                        continue;
                    }
                    // Then the group's writers (ours among them, unless the group was full)
                    // have their results; a connection that could not be opened failed
                    // them all.
                    run_group(gate, group).await?;
                }
            }
        }
    }

    fn push(&self, job: Box<dyn Job<C>>) {
        self.queued().push(job);
    }

    /// The oldest queued writes, at most [`MAX_GROUP`], leaving out abandoned ones.
    fn take_group(&self) -> Group<C> {
        let mut queued = self.queued();
        let n = queued.len().min(MAX_GROUP);
        Group(queued.drain(..n).filter(|job| !job.abandoned()).collect())
    }

    fn queued(&self) -> MutexGuard<'_, Vec<Box<dyn Job<C>>>> {
        // Only push and drain happen under this lock: a panic cannot leave it inconsistent.
        self.queued.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Writes taken off the queue together, to run in one transaction. Dropped without
/// [`run`](Self::run), each of its writers gets [`SetupError::WriteLost`].
pub(crate) struct Group<C>(Vec<Box<dyn Job<C>>>);

impl<C> Group<C> {
    /// Run the group in one transaction on `conn`; if that fails, each write alone, in
    /// order, in its own transaction. Each write reads "now" from `clock` when its turn
    /// comes; a try that finds another connection's lock runs again within
    /// `busy_timeout`. Every writer has its result when this returns. Blocking.
    pub(crate) fn run(
        self,
        conn: &mut Connection,
        context: &C,
        clock: &dyn Clock,
        busy_timeout: Duration,
    ) {
        let mut group = self.0;
        if group.len() > 1 {
            let together = retry_busy(busy_timeout, || {
                in_transaction(conn, |tx| {
                    group
                        .iter_mut()
                        .try_for_each(|job| job.run(tx, context, clock.now()))
                })
            });
            if together.is_ok() {
                group.into_iter().for_each(|job| job.succeed());
                return;
            }
        }
        for mut job in group {
            let alone = retry_busy(busy_timeout, || {
                in_transaction(conn, |tx| job.run(tx, context, clock.now()))
            });
            match alone {
                Ok(()) => job.succeed(),
                Err(e) => job.fail(e),
            }
        }
    }
}

/// Run `body` in a `BEGIN IMMEDIATE` transaction on `conn`: commit when it returns `Ok`,
/// roll back otherwise (and when `body` panics, or the `COMMIT` fails).
///
/// `BEGIN IMMEDIATE` and `COMMIT` run as cached statements: rusqlite's `Transaction`
/// prepares both again on every call, which was about 8 % of the client's instructions per
/// claim+commit (callgrind).
pub(crate) fn in_transaction<T>(
    conn: &mut Connection,
    body: impl FnOnce(&Connection) -> Result<T>,
) -> Result<T> {
    run_cached(conn, "BEGIN IMMEDIATE")?;
    let mut open = OpenTransaction {
        conn,
        committed: false,
    };
    let out = body(open.conn)?;
    run_cached(open.conn, "COMMIT")?;
    open.committed = true;
    Ok(out)
}

/// One statement without rows, from the connection's statement cache.
fn run_cached(conn: &Connection, sql: &str) -> Result<()> {
    conn.prepare_cached(sql)
        .and_then(|mut statement| statement.execute([]))
        .map(drop)
        .map_err(backend)
}

/// A transaction [`in_transaction`] began and has not committed: dropped (an error, a
/// panic), it rolls back, as rusqlite's `Transaction` does.
struct OpenTransaction<'c> {
    conn: &'c Connection,
    committed: bool,
}

impl Drop for OpenTransaction<'_> {
    fn drop(&mut self) {
        if !self.committed && !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use dedup_core::SystemClock;

    use super::*;

    fn lock(conn: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
        conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `in_transaction` commits on `Ok`, and rolls back on an error and on a panic, leaving
    /// the connection out of any transaction either way.
    #[test]
    fn a_transaction_commits_on_ok_and_rolls_back_on_error_or_panic() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER)").unwrap();
        let insert = |tx: &Connection, x: i64| {
            tx.execute("INSERT INTO t VALUES (?1)", [x])
                .map(drop)
                .map_err(backend)
        };
        in_transaction(&mut conn, |tx| insert(tx, 1)).unwrap();
        let failed = in_transaction(&mut conn, |tx| {
            insert(tx, 2)?;
            Err::<(), _>(Error::invalid("x", "refused"))
        });
        assert!(failed.is_err());
        assert!(conn.is_autocommit());
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            in_transaction(&mut conn, |tx| -> Result<()> {
                insert(tx, 3)?;
                panic!("the body panics")
            })
        }));
        assert!(panicked.is_err());
        assert!(conn.is_autocommit());
        let rows: Vec<i64> = conn
            .prepare("SELECT x FROM t ORDER BY x")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(rows, [1]);
        in_transaction(&mut conn, |tx| insert(tx, 4)).unwrap();
        assert_eq!(
            conn.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
                .unwrap(),
            2
        );
    }

    /// The queue on its own, with a context that counts the runs of every write: three
    /// writes queued behind the held gate run as one group; the middle one fails, so the
    /// group rolls back and each runs again alone. Only the failing one fails.
    #[tokio::test(flavor = "current_thread")]
    async fn a_group_runs_together_then_alone_and_a_failing_write_fails_alone() {
        let queue = Arc::new(WriteQueue::<AtomicUsize>::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let conn = Arc::new(Mutex::new(Connection::open_in_memory().unwrap()));
        lock(&conn)
            .execute_batch("CREATE TABLE t (x INTEGER PRIMARY KEY)")
            .unwrap();

        let gate = queue.gate().await;
        let writes: Vec<_> = [(1, false), (2, true), (3, false)]
            .into_iter()
            .map(|(x, fail)| {
                let (queue, runs, conn) = (queue.clone(), runs.clone(), conn.clone());
                tokio::spawn(async move {
                    let op = move |tx: &Connection, runs: &AtomicUsize, _now| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tx.execute("INSERT INTO t VALUES (?1)", [x])
                            .map_err(backend)?;
                        match fail {
                            true => Err(Error::invalid("x", "this write fails")),
                            false => Ok(x),
                        }
                    };
                    queue
                        .write(op, |gate, group| {
                            let (runs, conn) = (runs.clone(), conn.clone());
                            async move {
                                let timeout = Duration::from_secs(1);
                                group.run(&mut lock(&conn), &runs, &SystemClock, timeout);
                                drop(gate);
                                Ok(())
                            }
                        })
                        .await
                })
            })
            .collect();
        while queue.queued().len() < 3 {
            tokio::task::yield_now().await;
        }
        drop(gate);

        let mut results = Vec::new();
        for write in writes {
            results.push(write.await.unwrap());
        }
        assert_eq!(results[0].as_ref().ok(), Some(&1));
        assert!(results[1].as_ref().unwrap_err().is_invalid_input());
        assert_eq!(results[2].as_ref().ok(), Some(&3));
        // Together: 1 ran, 2 failed (3 never started); then 1, 2 and 3 alone.
        assert_eq!(runs.load(Ordering::SeqCst), 5);
        let kept: Vec<i64> = lock(&conn)
            .prepare("SELECT x FROM t ORDER BY x")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(kept, vec![1, 3]);
    }
}
