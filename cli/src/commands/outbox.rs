//! `dedup outbox ...`: the transactional outbox of an SQL store, for operators: counts by
//! state, a listing, a retry of a dead row, a purge of sent rows. One file per subcommand;
//! this one dispatches.

mod list;
mod purge;
mod retry;
mod stats;

use dedup_core::Timestamp;
use dedup_core::outbox::OutboxState;
use serde_json::{Value, json};

use crate::failure::Failure;
use crate::render::rfc3339;
use crate::{OutboxCommand, OutboxStateArg, StoreArgs};

impl From<OutboxStateArg> for OutboxState {
    fn from(s: OutboxStateArg) -> Self {
        match s {
            OutboxStateArg::Pending => OutboxState::Pending,
            OutboxStateArg::Held => OutboxState::Held,
            OutboxStateArg::Sent => OutboxState::Sent,
            OutboxStateArg::Dead => OutboxState::Dead,
        }
    }
}

/// A time as JSON: its UTC text and its milliseconds.
fn time_json(t: Timestamp) -> Value {
    json!({ "utc": rfc3339(t), "ms": t.as_millis() })
}

/// Run `dedup outbox <command>`.
pub(crate) async fn run(
    args: &StoreArgs,
    as_json: bool,
    command: OutboxCommand,
) -> Result<(), Failure> {
    match command {
        OutboxCommand::Stats => stats::run(args, as_json).await,
        OutboxCommand::List {
            state,
            destination,
            limit,
            after,
        } => list::run(args, as_json, state, destination, limit, after).await,
        OutboxCommand::Retry { id } => retry::run(args, as_json, id).await,
        OutboxCommand::Purge {
            retention,
            batch,
            unpaced,
        } => purge::run(args, as_json, &retention, batch, unpaced).await,
    }
}
