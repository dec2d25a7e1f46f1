//! Records as rows: reading a row into a [`Record`] and binding a [`Record`] as parameters.

use dedup_core::{Error, Fingerprint, Key, LeaseToken, Record, RecordState, Result, Timestamp};
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::error::backend;
use crate::queries::Queries;

const IN_FLIGHT: &str = "in_flight";
const COMPLETED: &str = "completed";

/// The raw column values of a record row, before validation.
struct RawRow {
    state: String,
    token: Option<String>,
    fence: i64,
    attempt: i64,
    expires_at: Option<i64>,
    processed_at: Option<i64>,
    outcome: Option<Vec<u8>>,
    fingerprint: Option<String>,
}

impl RawRow {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(RawRow {
            state: row.get(0)?,
            token: row.get(1)?,
            fence: row.get(2)?,
            attempt: row.get(3)?,
            expires_at: row.get(4)?,
            processed_at: row.get(5)?,
            outcome: row.get(6)?,
            fingerprint: row.get(7)?,
        })
    }

    fn into_record(self, key: &Key) -> Result<Record> {
        let corrupt = |detail: String| Error::Corrupt {
            key: key.clone(),
            detail,
        };
        let fence = u64::try_from(self.fence)
            .ok()
            .filter(|f| *f >= 1)
            .ok_or_else(|| corrupt(format!("fence {} is not a positive integer", self.fence)))?;
        let attempt = u32::try_from(self.attempt)
            .ok()
            .filter(|a| *a >= 1)
            .ok_or_else(|| corrupt(format!("attempt {} is out of range", self.attempt)))?;
        let token = self
            .token
            .map(|t| LeaseToken::parse(&t).ok_or_else(|| corrupt(format!("token {t:?}"))))
            .transpose()?;
        let fingerprint = self
            .fingerprint
            .map(|f| Fingerprint::new(f).map_err(|e| corrupt(format!("fingerprint: {e}"))))
            .transpose()?;
        let state = match (self.state.as_str(), token) {
            (IN_FLIGHT, Some(token)) => RecordState::InFlight {
                token,
                expires_at: Timestamp::from_millis(
                    self.expires_at
                        .ok_or_else(|| corrupt("in flight without expires_at".into()))?,
                ),
            },
            (IN_FLIGHT, None) => return Err(corrupt("in flight without a token".into())),
            (COMPLETED, token) => RecordState::Completed {
                token,
                processed_at: Timestamp::from_millis(
                    self.processed_at
                        .ok_or_else(|| corrupt("completed without processed_at".into()))?,
                ),
                outcome: self.outcome,
            },
            (other, _) => return Err(corrupt(format!("unknown state {other:?}"))),
        };
        Ok(Record {
            key: key.clone(),
            fence,
            attempt,
            fingerprint,
            state,
        })
    }
}

/// The record of `key`, if any.
pub(crate) fn select(conn: &Connection, queries: &Queries, key: &Key) -> Result<Option<Record>> {
    conn.prepare_cached(&queries.select)
        .and_then(|mut stmt| {
            stmt.query_row(params![key.consumer(), key.message_id()], RawRow::read)
                .optional()
        })
        .map_err(backend)?
        .map(|raw| raw.into_record(key))
        .transpose()
}

/// Insert or replace `record`.
pub(crate) fn put(conn: &Connection, queries: &Queries, record: &Record) -> Result<()> {
    let fence = i64::try_from(record.fence).map_err(|_| Error::Corrupt {
        key: record.key.clone(),
        detail: format!("fence {} does not fit SQLite's INTEGER", record.fence),
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
    conn.prepare_cached(&queries.put)
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
        }
    }

    #[test]
    fn malformed_rows_are_corrupt_not_panics() {
        let key = Key::new("c", "m").unwrap();
        let cases = [
            RawRow {
                state: "weird".into(),
                ..raw(IN_FLIGHT)
            },
            RawRow {
                token: None,
                ..raw(IN_FLIGHT)
            },
            RawRow {
                token: Some("not a uuid".into()),
                ..raw(IN_FLIGHT)
            },
            RawRow {
                fence: -1,
                ..raw(IN_FLIGHT)
            },
            RawRow {
                attempt: i64::from(u32::MAX) + 1,
                ..raw(IN_FLIGHT)
            },
            RawRow {
                expires_at: None,
                ..raw(IN_FLIGHT)
            },
            RawRow {
                processed_at: None,
                ..raw(COMPLETED)
            },
            RawRow {
                fingerprint: Some(String::new()),
                ..raw(COMPLETED)
            },
        ];
        for case in cases {
            let err = case.into_record(&key).unwrap_err();
            assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
        }
        assert!(raw(IN_FLIGHT).into_record(&key).is_ok());
        assert!(raw(COMPLETED).into_record(&key).is_ok());
    }
}
