//! `dedup outbox list`: the outbox's rows in id order, a page at a time.

use dedup_core::outbox::{OutboxEntry, OutboxQuery};
use serde_json::{Value, json};

use crate::failure::Failure;
use crate::open::{Access, open_outbox};
use crate::render::{print, utc, when};
use crate::screen::line;
use crate::{OutboxStateArg, StoreArgs};

use super::time_json;

/// Show a page of rows: at most `limit`, after the id `after`, in `state` and for
/// `destination` only.
pub(super) async fn run(
    args: &StoreArgs,
    as_json: bool,
    state: Option<OutboxStateArg>,
    destination: Option<String>,
    limit: usize,
    after: Option<i64>,
) -> Result<(), Failure> {
    let (outbox, _) = open_outbox(args, Access::Read).await?;
    let query = OutboxQuery {
        state: state.map(Into::into),
        destination,
        after_id: after,
        limit,
    };
    let rows = outbox
        .list(&query)
        .await
        .map_err(|e| Failure::store("cannot list the outbox", e))?;
    let now = outbox.stats().await.map(|s| s.now).ok();
    print(
        as_json,
        json!({ "rows": rows.iter().map(entry_json).collect::<Vec<_>>() }),
        || {
            if rows.is_empty() {
                return "no rows".into();
            }
            let mut out = vec![format!(
                "{:>10}  {:<7}  {:>8}  {:<20}  {:<24}  {}",
                "id", "state", "attempts", "destination", "due", "message id"
            )];
            for e in &rows {
                let due = match now {
                    Some(now) => when(e.due_at, now),
                    None => utc(e.due_at),
                };
                out.push(format!(
                    "{:>10}  {:<7}  {:>8}  {:<20}  {:<24}  {}",
                    e.row.id,
                    e.state.as_str(),
                    e.row.attempts,
                    line(&e.row.destination),
                    due,
                    line(&e.row.message_id)
                ));
                if let Some(error) = &e.last_error {
                    out.push(format!("{:>10}  last error: {}", "", line(error)));
                }
            }
            out.join("\n")
        },
    );
    Ok(())
}

/// One row as JSON (its payload counted, not shown).
fn entry_json(e: &OutboxEntry) -> Value {
    json!({
        "id": e.row.id,
        "state": e.state.as_str(),
        "destination": e.row.destination,
        "message_id": e.row.message_id,
        "ordering_key": e.row.ordering_key,
        "attempts": e.row.attempts,
        "written_at": time_json(e.row.written_at),
        "due_at": time_json(e.due_at),
        "sent_at": e.sent_at.map(time_json),
        "last_error": e.last_error,
        "headers": e.row.headers.iter().map(|(n, v)| json!([n, v])).collect::<Vec<_>>(),
        "payload_bytes": e.row.payload.len(),
    })
}
