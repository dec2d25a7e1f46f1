//! Rows of the outbox statements: the shared column decoding (every dialect selects the
//! same column names), the counts by state, and the headers' JSON text.

use dedup_core::backend::outbox::RawOutboxRow;
use dedup_core::outbox::OutboxMessage;
use dedup_core::{Error, Result};
use sqlx::{ColumnIndex, Database, Decode, Row, Type};

use crate::query::SqlDb;

/// The columns every dialect's row-returning outbox statements select, by these names.
pub const ROW_COLUMNS: [&str; 12] = [
    "id",
    "destination",
    "message_id",
    "headers",
    "payload",
    "ordering_key",
    "written_at",
    "attempts",
    "state",
    "due_at",
    "sent_at",
    "last_error",
];

/// Decode one row of [`ROW_COLUMNS`] (`headers` as JSON text, `attempts` a 32-bit
/// integer), driver errors mapped by `map` (the backend's error mapping, which keeps the
/// driver error as the source).
pub fn decode_row<'r, R>(
    row: &'r R,
    backend: &'static str,
    map: fn(sqlx::Error) -> Error,
) -> Result<RawOutboxRow>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    i32: Decode<'r, R::Database> + Type<R::Database>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
    R::Database: Database,
{
    let id: i64 = row.try_get("id").map_err(map)?;
    let headers: String = row.try_get("headers").map_err(map)?;
    let attempts: i32 = row.try_get("attempts").map_err(map)?;
    Ok(RawOutboxRow {
        id,
        destination: row.try_get("destination").map_err(map)?,
        message_id: row.try_get("message_id").map_err(map)?,
        headers: decode_headers(id, &headers, backend)?,
        payload: row.try_get("payload").map_err(map)?,
        ordering_key: row.try_get("ordering_key").map_err(map)?,
        written_at: row.try_get("written_at").map_err(map)?,
        attempts: i64::from(attempts),
        state: row.try_get("state").map_err(map)?,
        due_at: row.try_get("due_at").map_err(map)?,
        sent_at: row.try_get("sent_at").map_err(map)?,
        last_error: row.try_get("last_error").map_err(map)?,
    })
}

/// The row count of one state (of one destination), as the dialect's counting statement
/// found it.
#[derive(Debug)]
pub struct StateCount {
    /// The destination, when the statement counted per destination.
    pub destination: Option<String>,
    /// The state as stored.
    pub state: String,
    /// How many rows are in it.
    pub rows: i64,
    /// The oldest `written_at` among them.
    pub oldest: Option<i64>,
}

/// The outbox table's counts by state and the store's "now".
#[derive(Debug, Default)]
pub struct StateCounts {
    /// The store's clock (ms since the Unix epoch).
    pub now_ms: i64,
    /// One entry per state that has rows.
    pub states: Vec<StateCount>,
}

/// The counts of a counting statement whose rows have `now_ms` and, per state with rows,
/// `state`, `n` and `oldest` (a single row with `state` NULL when the table is empty), and
/// `destination` too when `by_destination`.
pub fn decode_state_counts<DB: SqlDb>(
    rows: &[DB::Row],
    by_destination: bool,
    map: fn(sqlx::Error) -> Error,
) -> Result<StateCounts> {
    let mut counts = StateCounts::default();
    for row in rows {
        counts.now_ms = DB::get_i64(row, "now_ms").map_err(map)?;
        if let Some(state) = DB::get_opt_text(row, "state").map_err(map)? {
            let destination = match by_destination {
                true => DB::get_opt_text(row, "destination").map_err(map)?,
                false => None,
            };
            counts.states.push(StateCount {
                destination,
                state,
                rows: DB::get_i64(row, "n").map_err(map)?,
                oldest: DB::get_opt_i64(row, "oldest").map_err(map)?,
            });
        }
    }
    Ok(counts)
}

/// The headers of row `id` from their stored JSON text (`[[name, value], ...]`).
pub fn decode_headers(id: i64, text: &str, backend: &'static str) -> Result<Vec<(String, String)>> {
    serde_json::from_str(text).map_err(|e| {
        Error::backend(
            backend,
            false,
            format!("outbox row {id} has unreadable headers: {e}"),
        )
    })
}

/// Each message's headers as the JSON text the table stores.
pub(crate) fn encode_headers(
    messages: &[OutboxMessage],
    backend: &'static str,
) -> Result<Vec<String>> {
    messages
        .iter()
        .map(|m| serde_json::to_string(m.headers()).map_err(|e| Error::backend(backend, false, e)))
        .collect()
}

/// A count or limit as a SQL `BIGINT`.
pub fn sql_limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_garbage_names_the_row() {
        let message = OutboxMessage::new("d", "m", b"x".to_vec())
            .unwrap()
            .header("a", "1")
            .unwrap()
            .header("b", "2")
            .unwrap();
        let text = encode_headers(std::slice::from_ref(&message), "test").unwrap();
        let back = decode_headers(7, &text[0], "test").unwrap();
        assert_eq!(back, message.headers().to_vec());
        let err = decode_headers(7, "{not json", "test").unwrap_err();
        assert!(format!("{err:?}").contains("outbox row 7"), "{err:?}");
    }
}
