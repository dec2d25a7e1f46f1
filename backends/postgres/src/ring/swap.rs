//! Retiring a partition by swapping it for an empty one, so that claims never wait on the
//! retirement.
//!
//! A truncate holds `ACCESS EXCLUSIVE` on the partition until it commits, and its commit
//! removes the old files (15 ms for 100 MB on a quiet server, 60 ms and more under load).
//! Every claim reads every partition, so every claim waits that long. The swap instead:
//!
//! 1. detaches the partition (`DETACH PARTITION ... CONCURRENTLY`: the parent takes
//!    `SHARE UPDATE EXCLUSIVE`, which claims and commits do not conflict with; the
//!    detach waits for the statements already using the partition);
//! 2. reads the clock again: if the ring came back to the slot meanwhile, it attaches the
//!    partition back and retires nothing;
//! 3. drops the detached table (its files go while nobody reads it);
//! 4. creates an empty table like the parent and attaches it to the slot.
//!
//! Between 1 and 4 the slot has no partition, and a row routed to it would fail ("no
//! partition of relation found for row"). Rows are routed to a slot only while the ring
//! is in its window, so the swap runs only when the ring's return to the slot is at least
//! [`SWAP_MARGIN`] away; closer, the purge truncates (see [`super::retire`]).
//!
//! A swap cut short (the purger's process or connection gone between two steps) leaves
//! the slot detach-pending, detached, or without a partition. [`PostgresStore::repair_ring`]
//! finishes it at the start of every purge batch, under the slot's advisory lock.

use std::time::Duration;

use dedup_core::{Result, duration_millis};
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, PgConnection, Postgres};

use super::Partitions;
use super::schema::{partition_name, qualified_partition};
use crate::PostgresStore;
use crate::config::PostgresConfig;
use crate::error::backend;

/// How far the ring's return to a slot must be for the slot to be swapped rather than
/// truncated: longer than a detach takes, even one that waits for slow statements.
pub(crate) const SWAP_MARGIN: Duration = Duration::from_secs(10);

/// Whether the ring, at `now_ms`, comes back to the slot whose latest window is `window`
/// no sooner than [`SWAP_MARGIN`].
pub(crate) fn swap_allowed(p: &Partitions, now_ms: i64, window: i64) -> bool {
    let returns_at = (window + i64::from(p.count)).saturating_mul(p.window_ms());
    returns_at.saturating_sub(now_ms) >= duration_millis(SWAP_MARGIN)
}

/// Run `statement` outside any transaction (the detach refuses one), as a simple query.
async fn run(conn: &mut PgConnection, statement: String) -> Result<()> {
    sqlx::raw_sql(AssertSqlSafe(statement))
        .execute(&mut *conn)
        .await
        .map_err(backend)?;
    Ok(())
}

/// Steps 3 and 4: drop what is left of `slot`'s partition (a detached table, or nothing)
/// and attach an empty one in its place.
async fn replace(conn: &mut PgConnection, config: &PostgresConfig, slot: u16) -> Result<()> {
    let (table, partition) = (config.qualified_table(), qualified_partition(config, slot));
    run(conn, format!("DROP TABLE IF EXISTS {partition}")).await?;
    run(
        conn,
        format!("CREATE TABLE {partition} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"),
    )
    .await?;
    run(
        conn,
        format!("ALTER TABLE {table} ATTACH PARTITION {partition} FOR VALUES IN ({slot})"),
    )
    .await
}

impl PostgresStore {
    /// Steps 1 to 4 for `slot`, whose latest window is `window`: `false` when the ring came
    /// back to the slot during the detach (the partition is attached back, nothing retired).
    pub(crate) async fn swap(
        &self,
        conn: &mut PgConnection,
        p: &Partitions,
        slot: u16,
        window: i64,
    ) -> Result<bool> {
        let config = self.config();
        let (table, partition) = (config.qualified_table(), qualified_partition(config, slot));
        run(
            conn,
            format!("ALTER TABLE {table} DETACH PARTITION {partition} CONCURRENTLY"),
        )
        .await?;
        let now_ms = self.now_ms(conn).await?;
        if !super::retire::still_latest(p, now_ms, window) {
            run(
                conn,
                format!("ALTER TABLE {table} ATTACH PARTITION {partition} FOR VALUES IN ({slot})"),
            )
            .await?;
            return Ok(false);
        }
        replace(conn, config, slot).await?;
        Ok(true)
    }

    /// Finish every swap cut short: a slot whose partition is detach-pending is detached
    /// (`FINALIZE`), and a slot without a partition gets an empty one (a detached table of
    /// its name is dropped: its rows were being retired). Each slot under its advisory
    /// lock; a slot another purger holds is left to it.
    pub(crate) async fn repair_ring(
        &self,
        conn: &mut PoolConnection<Postgres>,
        p: &Partitions,
    ) -> Result<()> {
        let config = self.config();
        let attached: Vec<(String, bool)> = sqlx::query_as(
            "SELECT c.relname::text, i.inhdetachpending FROM pg_inherits i \
             JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass",
        )
        .bind(config.qualified_table())
        .fetch_all(&mut **conn)
        .await
        .map_err(backend)?;
        for slot in 0..p.count {
            let name = partition_name(&config.table, slot);
            let pending = match attached.iter().find(|(n, _)| *n == name) {
                Some((_, false)) => continue,
                Some((_, true)) => true,
                None => false,
            };
            let Some(lock) = self.lock_slot(conn, slot).await? else {
                continue;
            };
            let repaired = async {
                if pending {
                    run(
                        conn,
                        format!(
                            "ALTER TABLE {} DETACH PARTITION {} FINALIZE",
                            config.qualified_table(),
                            qualified_partition(config, slot)
                        ),
                    )
                    .await?;
                }
                // Another purger may have finished it before the lock was ours.
                let missing: bool = sqlx::query_scalar(
                    "SELECT NOT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c \
                     ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass AND c.relname = $2)",
                )
                .bind(config.qualified_table())
                .bind(&name)
                .fetch_one(&mut **conn)
                .await
                .map_err(backend)?;
                if missing {
                    replace(conn, config, slot).await?;
                }
                Ok(())
            }
            .await;
            self.unlock_slot(conn, lock).await;
            repaired?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_swapped_only_well_before_the_ring_returns() {
        let p = Partitions {
            window: Duration::from_secs(60),
            count: 5,
        };
        // Window 0 (slot 0) comes back at 300 s.
        assert!(swap_allowed(&p, 200_000, 0));
        assert!(swap_allowed(&p, 290_000, 0));
        assert!(!swap_allowed(&p, 290_001, 0));
        assert!(!swap_allowed(&p, 299_999, 0));
        // Windows shorter than the margin always truncate.
        let short = Partitions {
            window: Duration::from_millis(50),
            count: 8,
        };
        assert!(!swap_allowed(&short, 100, 0));
    }
}
