//! The store's own short transactions: a locking read of an operation's keys, the contract
//! applied to what it read ([`Working`]), the writes it made in as few statements as fit,
//! commit; a race lost to a concurrent writer runs it all again.

use std::collections::BTreeMap;
use std::time::Duration;

use dedup_core::backend::transition::Write;
use dedup_core::{Key, Record, RecordState, Result, Timestamp};
use sqlx::mysql::MySqlArguments;
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, MySql, MySqlConnection};

use super::{MySqlStore, ReadError};
use crate::error::{backend, lost_race, raced};
use crate::statements::{BEGIN, COLUMNS};

/// How many times an operation of the store's own runs again after losing a race (a
/// concurrent insert of the same new key, a deadlock) before giving up with a retryable
/// error.
const MAX_TRIES: u32 = 32;

/// Rows per write statement at most, and outcome bytes per statement at most (a batch of
/// 1 000 commits of 64 KiB is split to stay well under `max_allowed_packet`).
const MAX_ROWS_PER_WRITE: usize = 1000;
const MAX_BYTES_PER_WRITE: usize = 4 << 20;

/// The records of an operation's keys as its locking read found them, and what the
/// operation writes.
pub(crate) struct Working {
    /// The read's "now".
    pub(crate) now: Timestamp,
    slots: BTreeMap<Key, Slot>,
}

struct Slot {
    /// Whether the key had a record when read (it is locked then).
    existed: bool,
    current: Option<Record>,
    claimed_at: i64,
    dirty: bool,
}

impl Working {
    /// The key's record as the operation sees it (after its own earlier writes).
    pub(crate) fn record(&self, key: &Key) -> Option<&Record> {
        self.slots.get(key).and_then(|s| s.current.as_ref())
    }

    /// Apply a transition's write; `claimed` when it is a claim (the record's `claimed_at`
    /// becomes "now").
    pub(crate) fn apply(&mut self, key: &Key, write: Write, claimed: bool) {
        if let Write::Put(record) = write {
            let now = self.now.as_millis();
            let slot = self.slots.entry(key.clone()).or_insert(Slot {
                existed: false,
                current: None,
                claimed_at: now,
                dirty: false,
            });
            if claimed {
                slot.claimed_at = now;
            }
            slot.current = Some(record);
            slot.dirty = true;
        }
    }

    /// Remove the key's record.
    pub(crate) fn remove(&mut self, key: &Key) {
        if let Some(slot) = self.slots.get_mut(key) {
            slot.current = None;
            slot.dirty = true;
        }
    }
}

impl MySqlStore {
    /// Run `apply` on `keys`' records in a transaction of the store's own: a locking read,
    /// `apply` (the contract, through `Working`), the writes it made, commit. A race lost
    /// to a concurrent writer (a duplicate key on insert, a deadlock) rolls back and runs
    /// it all again.
    pub(crate) async fn locked<T>(
        &self,
        what: &'static str,
        keys: &[&Key],
        mut apply: impl FnMut(&mut Working) -> T + Send,
    ) -> Result<T> {
        let mut keys: Vec<&Key> = keys.to_vec();
        keys.sort();
        keys.dedup();
        for attempt in 0..MAX_TRIES {
            if attempt > 0 {
                // Let the winner of the race commit; spread the losers out.
                let pause = 50 * u64::from(attempt.min(20));
                tokio::time::sleep(Duration::from_micros(pause)).await;
            }
            let mut tx = self.inner.pool.begin_with(BEGIN).await.map_err(backend)?;
            let (now, found) = match self.read(&mut tx, &keys, true).await {
                Ok(read) => read,
                Err(ReadError::Sql(e)) if lost_race(&e) => continue,
                Err(ReadError::Sql(e)) => return Err(backend(e)),
                Err(ReadError::Contract(e)) => return Err(e),
            };
            let mut working = Working {
                now,
                slots: found
                    .into_iter()
                    .map(|(key, stored)| {
                        (
                            key,
                            Slot {
                                existed: true,
                                current: Some(stored.record),
                                claimed_at: stored.claimed_at,
                                dirty: false,
                            },
                        )
                    })
                    .collect(),
            };
            let out = apply(&mut working);
            match self.write(&mut tx, &working).await {
                Ok(()) => {}
                Err(e) if lost_race(&e) => continue,
                Err(e) => return Err(backend(e)),
            }
            match tx.commit().await {
                Ok(()) => return Ok(out),
                Err(e) if lost_race(&e) => continue,
                Err(e) => return Err(backend(e)),
            }
        }
        Err(raced(what))
    }

    /// Write the records `working` changed: new ones with a plain insert (a concurrent
    /// insert of the same key makes it fail with a duplicate key: the race is lost), the
    /// ones read (locked) with an insert that overwrites them, removed ones with a delete.
    pub(super) async fn write(
        &self,
        conn: &mut MySqlConnection,
        working: &Working,
    ) -> std::result::Result<(), sqlx::Error> {
        let removed: Vec<&Key> = working
            .slots
            .iter()
            .filter(|(_, s)| s.dirty && s.existed && s.current.is_none())
            .map(|(k, _)| k)
            .collect();
        if !removed.is_empty() {
            let mut query = sqlx::query(AssertSqlSafe(self.inner.sql.delete(removed.len())));
            for key in removed {
                query = query.bind(key.consumer()).bind(key.message_id());
            }
            query.execute(&mut *conn).await?;
        }
        for existed in [false, true] {
            let rows: Vec<(&Key, &Slot)> = working
                .slots
                .iter()
                .filter(|(_, s)| s.dirty && s.existed == existed && s.current.is_some())
                .collect();
            let mut start = 0;
            while start < rows.len() {
                let mut end = start;
                let mut bytes = 0;
                while end < rows.len() && end - start < MAX_ROWS_PER_WRITE {
                    bytes += rows[end]
                        .1
                        .current
                        .as_ref()
                        .map_or(0, |r| outcome_len(r) + 512);
                    if end > start && bytes > MAX_BYTES_PER_WRITE {
                        break;
                    }
                    end += 1;
                }
                let chunk = &rows[start..end];
                let sql = self.inner.sql.write(chunk.len(), existed);
                let mut query = sqlx::query(AssertSqlSafe(sql));
                for (key, slot) in chunk {
                    if let Some(record) = &slot.current {
                        query = bind_record(query, key, record, slot.claimed_at);
                    }
                }
                query.execute(&mut *conn).await?;
                start = end;
            }
        }
        Ok(())
    }
}

fn outcome_len(record: &Record) -> usize {
    match &record.state {
        RecordState::Completed {
            outcome: Some(o), ..
        } => o.len(),
        _ => 0,
    }
}

/// Bind `record`'s columns in [`COLUMNS`] order.
fn bind_record<'q>(
    query: Query<'q, MySql, MySqlArguments>,
    key: &Key,
    record: &Record,
    claimed_at: i64,
) -> Query<'q, MySql, MySqlArguments> {
    debug_assert_eq!(COLUMNS.len(), 12);
    let (token, expires_at, processed_at, outcome) = match &record.state {
        RecordState::InFlight { token, expires_at } => (
            Some(token.to_string()),
            Some(expires_at.as_millis()),
            None,
            None,
        ),
        RecordState::Completed {
            token,
            processed_at,
            outcome,
        } => (
            token.map(|t| t.to_string()),
            None,
            Some(processed_at.as_millis()),
            outcome.clone(),
        ),
    };
    query
        .bind(key.consumer().to_owned())
        .bind(key.message_id().to_owned())
        .bind(token)
        .bind(i64::try_from(record.fence).unwrap_or(i64::MAX))
        .bind(i64::from(record.attempt))
        .bind(claimed_at)
        .bind(expires_at)
        .bind(processed_at)
        .bind(outcome)
        .bind(record.fingerprint.as_ref().map(|f| f.as_str().to_owned()))
        .bind(record.first_claimed_at.map(|t| t.as_millis()))
        .bind(
            record
                .last_failure
                .as_ref()
                .map(dedup_core::Failure::encode),
        )
}
