//! `dedup outbox retry`: make a dead (or pending) row pending again, due now.

use serde_json::json;

use crate::StoreArgs;
use crate::failure::Failure;
use crate::open::{Access, open_outbox};
use crate::render::print;

/// Retry the row `id`.
pub(super) async fn run(args: &StoreArgs, as_json: bool, id: i64) -> Result<(), Failure> {
    let (outbox, _) = open_outbox(args, Access::Write).await?;
    let retried = outbox
        .retry(id)
        .await
        .map_err(|e| Failure::store("cannot retry the row", e))?;
    if !retried {
        return Err(
            Failure::not_found(format!("no dead or pending outbox row {id}"))
                .hint("`dedup outbox list --state dead` shows the rows a retry applies to"),
        );
    }
    print(as_json, json!({ "id": id, "retried": true }), || {
        format!("row {id} is pending again, due now, attempts reset")
    });
    Ok(())
}
