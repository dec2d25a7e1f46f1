//! `dedup list`: the records of one consumer, in message id order, a page at a time.

use dedup_core::ListFilter;
use serde_json::json;

use crate::failure::Failure;
use crate::open::{Access, Opened, open};
use crate::render::{print, record_json, when};
use crate::screen::line;
use crate::{StateArg, StoreArgs};

use super::now;

/// Show a page of `consumer`'s records: at most `limit`, after `after`, in `state` only.
pub(super) async fn run(
    args: &StoreArgs,
    as_json: bool,
    consumer: String,
    state: Option<StateArg>,
    limit: usize,
    after: Option<String>,
) -> Result<(), Failure> {
    let Opened { store, .. } = open(args, Access::Read).await?;
    let mut filter = ListFilter::consumer(consumer).limit(limit);
    filter.status = state.map(Into::into);
    filter.after = after;
    let now = now(&*store).await?;
    let records = store
        .list(&filter)
        .await
        .map_err(|e| Failure::store("cannot list records", e))?;
    let next = match records.len() == filter.limit {
        true => records.last().map(|r| r.key.message_id().to_owned()),
        false => None,
    };
    let json = json!({
        "records": records.iter().map(|r| record_json(r, now)).collect::<Vec<_>>(),
        "next_after": next,
    });
    print(as_json, json, || {
        let mut out: Vec<String> = records
            .iter()
            .map(|r| {
                let status = dedup_core::Status::of(r, now);
                let at = match &r.state {
                    dedup_core::RecordState::InFlight { expires_at, .. }
                        if status == dedup_core::Status::InFlight =>
                    {
                        format!("expires {}", when(*expires_at, now))
                    }
                    dedup_core::RecordState::InFlight { expires_at, .. } => {
                        format!("expired {}", when(*expires_at, now))
                    }
                    dedup_core::RecordState::Completed { processed_at, .. } => {
                        let verb = match status {
                            dedup_core::Status::DeadLettered => "dead-lettered",
                            dedup_core::Status::Failed => "failed",
                            _ => "processed",
                        };
                        format!("{verb} {}", when(*processed_at, now))
                    }
                };
                let cause = crate::render::short_cause(r)
                    .map(|c| format!(": {c}"))
                    .unwrap_or_default();
                format!(
                    "{:<24} {:<11} attempt {:<3} fence {:<3} {at}{cause}",
                    line(r.key.message_id()),
                    status.as_str(),
                    r.attempt,
                    r.fence
                )
            })
            .collect();
        if out.is_empty() {
            out.push(format!(
                "no records for consumer {}",
                line(&filter.consumer)
            ));
        }
        if let Some(next) = &next {
            out.push(format!("(more: --after {})", line(next)));
        }
        out.join("\n")
    });
    Ok(())
}
