//! Records as rows: decoding a row into a [`Record`] (checked by the shared decoder), and
//! its inverse, binding a [`Record`] as a row's parameters ([`put`]), kept beside it so the
//! two mappings of the state column stay in step.

use dedup_core::backend::{RawRecord, RawState};
use dedup_core::{Error, Fingerprint, Key, Record, RecordState, Result, Timestamp};
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::error::backend;
use crate::statements::Statements;

const IN_FLIGHT: &str = "in_flight";
const COMPLETED: &str = "completed";

/// The column values of a record row, as stored.
pub(crate) struct RawRow {
    state: String,
    token: Option<String>,
    fence: i64,
    attempt: i64,
    expires_at: Option<i64>,
    processed_at: Option<i64>,
    outcome: Option<Vec<u8>>,
    fingerprint: Option<String>,
    first_claimed_at: Option<i64>,
    last_failure: Option<Vec<u8>>,
}

impl RawRow {
    pub(crate) fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(RawRow {
            state: row.get(0)?,
            token: row.get(1)?,
            fence: row.get(2)?,
            attempt: row.get(3)?,
            expires_at: row.get(4)?,
            processed_at: row.get(5)?,
            outcome: row.get(6)?,
            fingerprint: row.get(7)?,
            first_claimed_at: row.get(8)?,
            last_failure: row.get(9)?,
        })
    }

    /// The record, checked by the shared decoder ([`RawRecord::decode`]).
    pub(crate) fn into_record(self, key: &Key) -> Result<Record> {
        let state = match self.state.as_str() {
            IN_FLIGHT => RawState::InFlight,
            COMPLETED => RawState::Completed,
            other => return Err(Error::corrupt(key, format!("unknown state {other:?}"))),
        };
        RawRecord {
            state,
            token: self.token.as_deref(),
            fence: self.fence,
            attempt: self.attempt,
            expires_at: self.expires_at,
            processed_at: self.processed_at,
            outcome: self.outcome,
            fingerprint: self.fingerprint.as_deref(),
            first_claimed_at: self.first_claimed_at,
            last_failure: self.last_failure.as_deref(),
        }
        .decode(key)
    }
}

/// The record of `key`, if any.
pub(crate) fn select(
    conn: &Connection,
    statements: &Statements,
    key: &Key,
) -> Result<Option<Record>> {
    conn.prepare_cached(&statements.select)
        .and_then(|mut stmt| {
            stmt.query_row(params![key.consumer(), key.message_id()], RawRow::read)
                .optional()
        })
        .map_err(backend)?
        .map(|raw| raw.into_record(key))
        .transpose()
}

/// Insert or replace `record`.
pub(crate) fn put(conn: &Connection, statements: &Statements, record: &Record) -> Result<()> {
    let fence = i64::try_from(record.fence).map_err(|_| {
        Error::corrupt(
            &record.key,
            format!("fence {} does not fit SQLite's INTEGER", record.fence),
        )
    })?;
    let (state, token, expires_at, processed_at, outcome) = match &record.state {
        RecordState::InFlight { token, expires_at } => (
            IN_FLIGHT,
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
            COMPLETED,
            token.map(|t| t.to_string()),
            None,
            Some(processed_at.as_millis()),
            outcome.as_deref(),
        ),
    };
    conn.prepare_cached(&statements.put)
        .and_then(|mut stmt| {
            stmt.execute(params![
                record.key.consumer(),
                record.key.message_id(),
                state,
                token,
                fence,
                record.attempt,
                expires_at,
                processed_at,
                outcome,
                record.fingerprint.as_ref().map(Fingerprint::as_str),
                record.first_claimed_at.map(Timestamp::as_millis),
                record
                    .last_failure
                    .as_ref()
                    .map(dedup_core::Failure::encode),
            ])
        })
        .map_err(backend)?;
    Ok(())
}

/// Whether a removed row's state (as returned by the purge statement) was completed.
pub(crate) fn is_completed_state(state: &str) -> bool {
    state == COMPLETED
}

#[cfg(test)]
mod tests {
    use super::*;
    use dedup_core::LeaseToken;

    fn raw(state: &str) -> RawRow {
        RawRow {
            state: state.into(),
            token: Some(LeaseToken::random().to_string()),
            fence: 1,
            attempt: 1,
            expires_at: Some(5),
            processed_at: Some(5),
            outcome: None,
            fingerprint: None,
            first_claimed_at: Some(4),
            last_failure: None,
        }
    }

    /// The contract's checks are the shared decoder's (tested in dedup-core); this backend
    /// adds its state column.
    #[test]
    fn states_map_and_unknown_states_are_corrupt() {
        let key = Key::new("c", "m").unwrap();
        let err = raw("weird").into_record(&key).unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
        let err = RawRow {
            fence: 0,
            ..raw(IN_FLIGHT)
        }
        .into_record(&key)
        .unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
        assert!(raw(IN_FLIGHT).into_record(&key).is_ok());
        assert!(raw(COMPLETED).into_record(&key).is_ok());
    }
}
