//! Decoding the rows the statements return into [`Record`]s: the rows of claims and commits
//! (with whether the statement wrote them, and its "now"), and plain record rows.

use std::collections::HashMap;

use dedup_core::backend::{RawRecord, RawState};
use dedup_core::{Key, Record, Result, Timestamp};
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::error::backend;

/// One row of a claim / commit statement (see [`crate::statements`]).
#[derive(Debug)]
pub(crate) struct StatementRow {
    /// Whether the statement wrote this record.
    pub(crate) wrote: bool,
    /// The record (after the write when `wrote`, else as of the statement's snapshot).
    pub(crate) record: Record,
}

/// The rows of one claim / commit statement (and of the read that may follow it), by key. A
/// key with a written row keeps that row; rows for keys not asked for are dropped.
#[derive(Debug, Default)]
pub(crate) struct StatementRows {
    /// The statement's "now" (`None` when no row came back).
    pub(crate) now: Option<Timestamp>,
    /// The row per requested key.
    pub(crate) by_key: HashMap<Key, StatementRow>,
}

impl StatementRows {
    /// Decode `rows`, keeping those whose key is among `keys`.
    pub(crate) fn decode<'k>(
        rows: &[PgRow],
        keys: impl IntoIterator<Item = &'k Key>,
    ) -> Result<Self> {
        let wanted: HashMap<(&str, &str), &Key> = keys
            .into_iter()
            .map(|k| ((k.consumer(), k.message_id()), k))
            .collect();
        let mut out = StatementRows::default();
        for row in rows {
            let consumer: &str = row.try_get("consumer").map_err(backend)?;
            let message_id: &str = row.try_get("message_id").map_err(backend)?;
            let Some(key) = wanted.get(&(consumer, message_id)) else {
                continue;
            };
            let wrote: bool = row.try_get("wrote").map_err(backend)?;
            let now = Timestamp::from_millis(row.try_get("now_ms").map_err(backend)?);
            out.now = Some(now);
            if !wrote && out.by_key.contains_key(*key) {
                continue;
            }
            let record = decode_record(row, key)?;
            out.by_key
                .insert((*key).clone(), StatementRow { wrote, record });
        }
        Ok(out)
    }
}

impl StatementRows {
    /// Add the rows of the read that followed the statement: the records of the keys it did
    /// not write, with that read's "now" (the time their records are as of).
    pub(crate) fn merge(&mut self, read: StatementRows) {
        self.now = read.now.or(self.now);
        for (key, row) in read.by_key {
            self.by_key.entry(key).or_insert(row);
        }
    }
}

/// The record columns of `row` (named as in [`crate::statements`]) as the record of `key`,
/// checked by the shared decoder. The state is implied: a processing time means completed.
pub(crate) fn decode_record(row: &PgRow, key: &Key) -> Result<Record> {
    let processed_at: Option<i64> = row.try_get("processed_at").map_err(backend)?;
    RawRecord {
        state: match processed_at {
            Some(_) => RawState::Completed,
            None => RawState::InFlight,
        },
        token: row.try_get("token").map_err(backend)?,
        fence: row.try_get("fence").map_err(backend)?,
        attempt: row.try_get::<i32, _>("attempt").map_err(backend)?.into(),
        expires_at: row.try_get("expires_at").map_err(backend)?,
        processed_at,
        outcome: row.try_get("outcome").map_err(backend)?,
        fingerprint: row.try_get("fingerprint").map_err(backend)?,
        first_claimed_at: row.try_get("first_claimed_at").map_err(backend)?,
        last_failure: row
            .try_get::<Option<&[u8]>, _>("last_failure")
            .map_err(backend)?,
    }
    .decode(key)
}

/// The record of a row holding the key and record columns ([`crate::statements::row_cols`]),
/// for reads that do not know the key beforehand (the operator's listings).
pub(crate) fn decode_keyed_record(row: &PgRow) -> Result<Record> {
    let consumer: String = row.try_get("consumer").map_err(backend)?;
    let message_id: String = row.try_get("message_id").map_err(backend)?;
    let key = Key::new(consumer, message_id)?;
    decode_record(row, &key)
}
