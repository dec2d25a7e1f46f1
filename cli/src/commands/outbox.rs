//! `dedup outbox ...`: the transactional outbox of an SQL store, for operators: counts by
//! state, a listing, a retry of a dead row, a purge of sent rows.

use dedup_core::outbox::{DestinationStats, OutboxEntry, OutboxQuery, OutboxState};
use dedup_core::{PurgeOptions, Timestamp, parse_duration};
use serde_json::{Value, json};

use crate::failure::Failure;
use crate::open::{Access, open_outbox};
use crate::render::{print, rfc3339, span, utc, when};
use crate::screen::line;
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

fn time_json(t: Timestamp) -> Value {
    json!({ "utc": rfc3339(t), "ms": t.as_millis() })
}

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

fn destination_json(d: &DestinationStats) -> Value {
    let s = &d.stats;
    json!({
        "destination": d.destination,
        "pending": s.pending,
        "held": s.held,
        "sent": s.sent,
        "dead": s.dead,
        "oldest_unsent": s.oldest_unsent.map(time_json),
        "oldest_unsent_age_ms": s.oldest_unsent.map(|_| s.oldest_unsent_age().as_millis() as u64),
    })
}

/// The per-destination table of `dedup outbox stats`.
fn destinations_text(destinations: &[DestinationStats]) -> String {
    let mut out = String::from("by destination:");
    if destinations.is_empty() {
        out.push_str(" none (no rows)");
    }
    for d in destinations {
        let s = &d.stats;
        let lag = match s.oldest_unsent {
            Some(_) => format!("oldest unsent {} ago", span(s.oldest_unsent_age())),
            None => "nothing unsent".into(),
        };
        out.push_str(&format!(
            "\n  {}: pending {}, held {}, sent {}, dead {}, {lag}",
            line(&d.destination),
            s.pending,
            s.held,
            s.sent,
            s.dead
        ));
    }
    out
}

/// Run `dedup outbox <command>`.
pub(crate) async fn run(
    args: &StoreArgs,
    as_json: bool,
    command: OutboxCommand,
) -> Result<(), Failure> {
    // Arguments first: a usage error never waits on a connection.
    let access = match &command {
        OutboxCommand::Stats | OutboxCommand::List { .. } => Access::Read,
        OutboxCommand::Retry { .. } | OutboxCommand::Purge { .. } => Access::Write,
    };
    let purge_options = match &command {
        OutboxCommand::Purge {
            retention,
            batch,
            unpaced,
        } => {
            let retention =
                parse_duration(retention).map_err(|e| Failure::store("invalid --retention", e))?;
            let mut options = PurgeOptions::older_than(retention).batch_size(*batch);
            if *unpaced {
                options = options.unpaced();
            }
            options
                .validate()
                .map_err(|e| Failure::store("invalid purge options", e))?;
            Some(options)
        }
        _ => None,
    };
    let (outbox, backend) = open_outbox(args, access).await?;
    match command {
        OutboxCommand::Stats => {
            let stats = outbox
                .stats()
                .await
                .map_err(|e| Failure::store("cannot read the outbox's stats", e))?;
            let destinations = outbox
                .stats_by_destination()
                .await
                .map_err(|e| Failure::store("cannot read the outbox's stats by destination", e))?;
            let json = json!({
                "backend": backend,
                "now": time_json(stats.now),
                "pending": stats.pending,
                "held": stats.held,
                "sent": stats.sent,
                "dead": stats.dead,
                "oldest_unsent": stats.oldest_unsent.map(time_json),
                "oldest_unsent_age_ms": stats.oldest_unsent.map(|_| stats.oldest_unsent_age().as_millis() as u64),
                "destinations": destinations.iter().map(destination_json).collect::<Vec<_>>(),
            });
            print(as_json, json, || {
                [
                    format!("outbox:   {backend}"),
                    format!("now:      {}", utc(stats.now)),
                    format!("pending:  {} (waiting to be published)", stats.pending),
                    format!("held:     {} (taken by a relay)", stats.held),
                    format!("sent:     {} (until purged)", stats.sent),
                    format!("dead:     {} (see `dedup outbox retry`)", stats.dead),
                    match stats.oldest_unsent {
                        Some(t) => format!(
                            "oldest unsent: written {} ({} ago)",
                            utc(t),
                            span(stats.oldest_unsent_age())
                        ),
                        None => "oldest unsent: none".into(),
                    },
                    destinations_text(&destinations),
                ]
                .join("\n")
            });
        }
        OutboxCommand::List {
            state,
            destination,
            limit,
            after,
        } => {
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
        }
        OutboxCommand::Retry { id } => {
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
        }
        OutboxCommand::Purge { retention, .. } => {
            let options = purge_options.expect("checked above");
            let report = outbox
                .purge(&options)
                .await
                .map_err(|e| Failure::store("cannot purge the outbox", e))?;
            print(
                as_json,
                json!({
                    "removed": report.completed,
                    "batches": report.batches,
                    "elapsed_ms": report.elapsed.as_millis() as u64,
                }),
                || {
                    format!(
                        "removed {} sent rows older than {retention} in {} batches ({})",
                        report.completed,
                        report.batches,
                        span(report.elapsed)
                    )
                },
            );
        }
    }
    Ok(())
}
