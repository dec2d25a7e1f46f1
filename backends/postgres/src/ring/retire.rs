//! The partitioned layout's purge: one batch retires one partition.
//!
//! 1. The partition is one whose latest window ended before the cutoff (now less the
//!    retention), never the current window's. Every row in it was last written before
//!    the cutoff, and no statement writes a row into it until the ring comes back to it.
//! 2. A session advisory lock per partition: purgers on many nodes never retire one
//!    twice.
//! 3. Its purgeable rows are counted, by kind, and the rest (a lease still live at the
//!    cutoff) are moved to the current window's partition, in a transaction of their own.
//! 4. In a second transaction, the partition is locked (`ACCESS EXCLUSIVE`: statements
//!    reading the table finish first, new ones wait; asked without queueing first, see
//!    [`lock_for_truncate`]), the clock is read again, and the partition is truncated
//!    only if the ring has not come back to it meanwhile (its latest window is still the
//!    one of step 1). The lock is held until the truncate commits.
//!
//! A row a commit moves out of the partition between the count and the truncate is
//! counted as removed though it was not.

use std::time::{Duration, Instant};

use dedup_core::backend::{PurgeBatch, PurgeStep};
use dedup_core::{Result, duration_millis};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

use super::Partitions;
use super::schema::qualified_partition;
use crate::PostgresStore;
use crate::ddl::fnv1a;
use crate::error::{backend, lock_not_available};
use crate::statements::{NOW_MS, purgeable_at};

/// How long the truncate asks for its lock without queueing for it, one try every
/// [`LOCK_RETRY_PAUSE`]: a lock request that waits makes every later claim wait behind it.
const TRUNCATE_LOCK_TRIES: Duration = Duration::from_millis(500);
const LOCK_RETRY_PAUSE: Duration = Duration::from_millis(2);

/// How long the truncate then waits in the queue for its lock before the batch gives up
/// (the purge runs it again later); claims queue behind it meanwhile.
const TRUNCATE_LOCK_WAIT: Duration = Duration::from_secs(1);

/// A transaction holding `partition` in `ACCESS EXCLUSIVE` mode: asked with `NOWAIT`
/// while [`TRUNCATE_LOCK_TRIES`] lasts (each refusal rolls back to a savepoint), then
/// waited for, at most [`TRUNCATE_LOCK_WAIT`].
async fn lock_for_truncate<'c>(
    conn: &'c mut PgConnection,
    partition: &str,
) -> Result<sqlx::Transaction<'c, sqlx::Postgres>> {
    let mut tx = conn.begin().await.map_err(backend)?;
    let tries_end = Instant::now() + TRUNCATE_LOCK_TRIES;
    while Instant::now() < tries_end {
        let mut attempt = tx.begin().await.map_err(backend)?;
        let locked = sqlx::query(AssertSqlSafe(format!(
            "LOCK TABLE {partition} IN ACCESS EXCLUSIVE MODE NOWAIT"
        )))
        .execute(&mut *attempt)
        .await;
        match locked {
            Ok(_) => {
                attempt.commit().await.map_err(backend)?;
                return Ok(tx);
            }
            Err(e) if lock_not_available(&e) => {
                attempt.rollback().await.map_err(backend)?;
                tokio::time::sleep(LOCK_RETRY_PAUSE).await;
            }
            Err(e) => return Err(backend(e)),
        }
    }
    for statement in [
        format!(
            "SET LOCAL lock_timeout = {}",
            TRUNCATE_LOCK_WAIT.as_millis()
        ),
        format!("LOCK TABLE {partition} IN ACCESS EXCLUSIVE MODE"),
    ] {
        sqlx::query(AssertSqlSafe(statement))
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
    }
    Ok(tx)
}

/// The partitions a purge at `now_ms` with `retention_ms` may retire, oldest window
/// first, each with its latest window (the current one or before), which ended at or
/// before the cutoff. Never the current window's slot.
pub(crate) fn retirable(p: &Partitions, now_ms: i64, retention_ms: i64) -> Vec<(u16, i64)> {
    let window = p.window_ms();
    let count = i64::from(p.count);
    let current = now_ms.div_euclid(window);
    let cutoff = now_ms.saturating_sub(retention_ms);
    // Window `current - back`, for back = count - 1 down to 1: oldest first.
    (1..count)
        .rev()
        .map(|back| current - back)
        .filter(|w| (w + 1).saturating_mul(window) <= cutoff)
        .map(|w| (w.rem_euclid(count) as u16, w))
        .collect()
}

/// Whether the ring still has `window` as the latest of its slot at `now_ms`: it has not
/// come back to that slot since.
fn still_latest(p: &Partitions, now_ms: i64, window: i64) -> bool {
    let current = now_ms.div_euclid(p.window_ms());
    window < current && current < window + i64::from(p.count)
}

impl PostgresStore {
    /// One batch of a partitioned table's purge: retire the oldest retirable partition
    /// holding rows. `exhausted` once none is left.
    pub(crate) async fn retire_batch(
        &self,
        p: &Partitions,
        step: &PurgeStep,
    ) -> Result<PurgeBatch> {
        p.check_retention(self.table(), step.retention)?;
        let retention_ms = duration_millis(step.retention);
        let mut conn = self.pool().acquire().await.map_err(backend)?;
        let started = Instant::now();
        let now_ms = self.now_ms(&mut conn).await?;
        for (slot, window) in retirable(p, now_ms, retention_ms) {
            // The two-key advisory lock space: (this table's, the slot).
            let table_key = fnv1a(format!("dedup-postgres retire {}", self.table()).as_bytes());
            let lock = (table_key as i32, i32::from(slot));
            let turn: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)")
                .bind(lock.0)
                .bind(lock.1)
                .fetch_one(&mut *conn)
                .await
                .map_err(backend)?;
            if !turn {
                continue; // another purger retires it
            }
            let retired = self
                .retire(&mut conn, p, slot, window, now_ms - retention_ms)
                .await;
            let unlocked = sqlx::query("SELECT pg_advisory_unlock($1, $2)")
                .bind(lock.0)
                .bind(lock.1)
                .execute(&mut *conn)
                .await;
            if unlocked.is_err() {
                conn.close_on_drop(); // the session, and its lock, end with the connection
            }
            if let Some((completed, expired)) = retired? {
                return Ok(PurgeBatch {
                    completed,
                    expired,
                    exhausted: false,
                    work: Some(started.elapsed()),
                });
            }
        }
        Ok(PurgeBatch {
            exhausted: true,
            work: Some(started.elapsed()),
            ..PurgeBatch::default()
        })
    }

    /// The store's "now" in ms.
    async fn now_ms(&self, conn: &mut PgConnection) -> Result<i64> {
        sqlx::query_scalar(AssertSqlSafe(format!("SELECT {NOW_MS}")))
            .bind(self.now_param())
            .fetch_one(&mut *conn)
            .await
            .map_err(backend)
    }

    /// Steps 3 and 4 for `slot`, whose latest window is `window`: the purgeable rows
    /// counted (completed, expired) and removed, or `None` when the partition was empty
    /// or the ring came back to it.
    async fn retire(
        &self,
        conn: &mut PgConnection,
        p: &Partitions,
        slot: u16,
        window: i64,
        cutoff: i64,
    ) -> Result<Option<(u64, u64)>> {
        let partition = qualified_partition(self.config(), slot);
        // Which rows the retirement removes at `$1`, the cutoff: the plain purge's rule.
        let purgeable = purgeable_at("$1");
        let (completed, expired, all): (i64, i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT count(*) FILTER (WHERE {purgeable} AND processed_at IS NOT NULL), \
                    count(*) FILTER (WHERE {purgeable} AND processed_at IS NULL), count(*) \
             FROM {partition}"
        )))
        .bind(cutoff)
        .fetch_one(&mut *conn)
        .await
        .map_err(backend)?;
        if all == 0 {
            return Ok(None);
        }
        if completed + expired < all {
            let now_ms = self.now_ms(conn).await?;
            sqlx::query(AssertSqlSafe(format!(
                "UPDATE {table} SET slot = $2 WHERE slot = $3 AND NOT coalesce({purgeable}, false)",
                table = self.table()
            )))
            .bind(cutoff)
            .bind(p.slot_at(now_ms))
            .bind(slot as i16)
            .execute(&mut *conn)
            .await
            .map_err(backend)?;
        }
        let mut tx = lock_for_truncate(conn, &partition).await?;
        let now_ms = self.now_ms(&mut tx).await?;
        if !still_latest(p, now_ms, window) {
            return Ok(None); // the ring came back to it: rolled back, retired next time round
        }
        sqlx::query(AssertSqlSafe(format!("TRUNCATE {partition}")))
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(Some((completed as u64, expired as u64)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(window_ms: u64, count: u16) -> Partitions {
        Partitions {
            window: Duration::from_millis(window_ms),
            count,
        }
    }

    #[test]
    fn only_windows_ended_before_the_cutoff_retire_oldest_first() {
        let p = ring(100, 5);
        // now 1 050: current window 10 (slot 0), windows 6..9 in slots 1..4.
        assert_eq!(retirable(&p, 1_050, 0), [(1, 6), (2, 7), (3, 8), (4, 9)]);
        // cutoff 900: windows ending at or before 900 are 6, 7, 8 (ends 700, 800, 900).
        assert_eq!(retirable(&p, 1_050, 150), [(1, 6), (2, 7), (3, 8)]);
        assert_eq!(retirable(&p, 1_050, 300), [(1, 6)]);
        assert!(retirable(&p, 1_050, 400).is_empty());
        // The current window's slot never retires.
        assert!(retirable(&p, 1_099, 0).iter().all(|(slot, _)| *slot != 0));
    }

    #[test]
    fn a_slot_the_ring_came_back_to_is_left() {
        let p = ring(100, 5);
        // Window 6 (slot 1) is the latest of its slot until window 11 starts at 1 100.
        assert!(still_latest(&p, 1_050, 6));
        assert!(still_latest(&p, 700, 6));
        assert!(!still_latest(&p, 1_100, 6));
        assert!(!still_latest(&p, 650, 6));
    }
}
