//! For SQL backends of the outbox: a stored row as the backend read it, checked and turned
//! into the [`OutboxEntry`] the [`OutboxStore`](crate::outbox::OutboxStore) methods return.
//! One place for the checks, so every backend reads rows the same way.

use crate::outbox::{OutboxEntry, OutboxRow, OutboxState};
use crate::{Error, Result, Timestamp};

/// An outbox row's columns as a backend read them (times in epoch milliseconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawOutboxRow {
    /// `id`.
    pub id: i64,
    /// `destination`.
    pub destination: String,
    /// `message_id`.
    pub message_id: String,
    /// `headers`, already decoded from the backend's encoding.
    pub headers: Vec<(String, String)>,
    /// `payload`.
    pub payload: Vec<u8>,
    /// `ordering_key`.
    pub ordering_key: Option<String>,
    /// `written_at`.
    pub written_at: i64,
    /// `attempts`.
    pub attempts: i64,
    /// `state`, as stored (`pending`, `held`, `sent`, `dead`).
    pub state: String,
    /// `due_at`.
    pub due_at: i64,
    /// `sent_at`.
    pub sent_at: Option<i64>,
    /// `last_error`.
    pub last_error: Option<String>,
}

impl RawOutboxRow {
    /// The row as an operator sees it. An unknown state or a negative attempt count is a
    /// non-retryable [`Error::Backend`] of `backend` naming the row.
    pub fn decode(self, backend: &'static str) -> Result<OutboxEntry> {
        let corrupt = |detail: String| {
            Error::backend(
                backend,
                false,
                format!("outbox row {} is unreadable: {detail}", self.id),
            )
        };
        let state = OutboxState::parse(&self.state)
            .ok_or_else(|| corrupt(format!("unknown state {:?}", self.state)))?;
        let attempts = u32::try_from(self.attempts)
            .map_err(|_| corrupt(format!("attempt count {}", self.attempts)))?;
        Ok(OutboxEntry {
            row: OutboxRow {
                id: self.id,
                destination: self.destination,
                message_id: self.message_id,
                headers: self.headers,
                payload: self.payload,
                ordering_key: self.ordering_key,
                written_at: Timestamp::from_millis(self.written_at),
                attempts,
            },
            state,
            due_at: Timestamp::from_millis(self.due_at),
            sent_at: self.sent_at.map(Timestamp::from_millis),
            last_error: self.last_error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> RawOutboxRow {
        RawOutboxRow {
            id: 7,
            destination: "orders".into(),
            message_id: "m".into(),
            headers: vec![("a".into(), "b".into())],
            payload: b"p".to_vec(),
            ordering_key: None,
            written_at: 10,
            attempts: 2,
            state: "held".into(),
            due_at: 11,
            sent_at: None,
            last_error: None,
        }
    }

    #[test]
    fn a_row_decodes_and_a_bad_one_names_itself() {
        let entry = raw().decode("test").unwrap();
        assert_eq!(entry.state, OutboxState::Held);
        assert_eq!(entry.row.attempts, 2);
        assert_eq!(entry.due_at, Timestamp::from_millis(11));
        let bad = RawOutboxRow {
            state: "lost".into(),
            ..raw()
        };
        let err = bad.decode("test").unwrap_err();
        assert!(
            err.to_string().contains("outbox row 7") || format!("{err:?}").contains("outbox row 7"),
            "{err:?}"
        );
        let negative = RawOutboxRow {
            attempts: -1,
            ..raw()
        };
        assert!(negative.decode("test").is_err());
    }
}
