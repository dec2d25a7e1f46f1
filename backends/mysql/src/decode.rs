//! Decoding rows into [`Record`]s, checked by the shared decoder.

use dedup_core::backend::{RawRecord, RawState};
use dedup_core::{Error, Key, Record, Result};
use sqlx::Row;
use sqlx::mysql::MySqlRow;

use crate::error::backend;

/// A stored record with the column the contract does not see: when the lease it holds (or
/// held when it was completed) was claimed, which purge walks.
#[derive(Clone, Debug)]
pub(crate) struct Stored {
    /// The record.
    pub(crate) record: Record,
    /// `claimed_at`, ms since the Unix epoch.
    pub(crate) claimed_at: i64,
}

/// A binary column (`VARBINARY`: the key, the fingerprint) as text. sqlx decodes only
/// non-binary columns as `String`; what the store wrote is UTF-8, anything else is an error
/// naming the column.
pub(crate) fn text(row: &MySqlRow, name: &str) -> Result<Option<String>> {
    let bytes: Option<Vec<u8>> = row.try_get(name).map_err(backend)?;
    bytes
        .map(|b| {
            String::from_utf8(b).map_err(|e| {
                Error::backend(crate::error::BACKEND, false, format!("column {name}: {e}"))
            })
        })
        .transpose()
}

/// The key of a row holding the key columns, `None` when they are NULL (the outer join of
/// [`Statements::read`](crate::statements::Statements::read) found no record).
pub(crate) fn key_of(row: &MySqlRow) -> Result<Option<Key>> {
    match (text(row, "consumer")?, text(row, "message_id")?) {
        (Some(c), Some(m)) => Ok(Some(Key::new(c, m)?)),
        _ => Ok(None),
    }
}

/// The record columns of `row` as the record of `key`. The state is implied: a processing
/// time means completed.
pub(crate) fn decode_record(row: &MySqlRow, key: &Key) -> Result<Record> {
    let processed_at: Option<i64> = row.try_get("processed_at").map_err(backend)?;
    let token: Option<String> = row.try_get("token").map_err(backend)?;
    let fingerprint = text(row, "fingerprint")?;
    let last_failure: Option<Vec<u8>> = row.try_get("last_failure").map_err(backend)?;
    RawRecord {
        state: match processed_at {
            Some(_) => RawState::Completed,
            None => RawState::InFlight,
        },
        token: token.as_deref(),
        fence: row.try_get("fence").map_err(backend)?,
        attempt: row.try_get("attempt").map_err(backend)?,
        expires_at: row.try_get("expires_at").map_err(backend)?,
        processed_at,
        outcome: row.try_get("outcome").map_err(backend)?,
        fingerprint: fingerprint.as_deref(),
        first_claimed_at: row.try_get("first_claimed_at").map_err(backend)?,
        last_failure: last_failure.as_deref(),
    }
    .decode(key)
}

/// The record and its claim time.
pub(crate) fn decode_stored(row: &MySqlRow, key: &Key) -> Result<Stored> {
    Ok(Stored {
        record: decode_record(row, key)?,
        claimed_at: row.try_get("claimed_at").map_err(backend)?,
    })
}

/// The record of a row holding the key and record columns, for reads that do not know the
/// key beforehand (the operator's listings).
pub(crate) fn decode_keyed_record(row: &MySqlRow) -> Result<Record> {
    let key = key_of(row)?
        .ok_or_else(|| Error::backend(crate::error::BACKEND, false, "a row without its key"))?;
    decode_record(row, &key)
}
