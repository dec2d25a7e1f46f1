//! `dedup forget`: remove a key's record so the next delivery processes the message as new.

use dedup_core::{Forgot, Key, Status};
use serde_json::json;

use crate::StoreArgs;
use crate::failure::Failure;
use crate::open::{Access, Opened, open};
use crate::render::{print, utc};
use crate::screen::line;

use super::key;

/// Remove the record of `consumer` / `message_id` (one held by a live lease too with
/// `force`).
pub(super) async fn run(
    args: &StoreArgs,
    as_json: bool,
    consumer: &str,
    message_id: &str,
    force: bool,
) -> Result<(), Failure> {
    let Opened { store, .. } = open(args, Access::Write).await?;
    let key = key(consumer, message_id)?;
    let forgot = store
        .forget(&key, force)
        .await
        .map_err(|e| Failure::store(format!("cannot forget {key}"), e))?;
    forget_answer(&key, forgot, as_json)
}

/// Print what `dedup forget` did, or the failure it is.
fn forget_answer(key: &Key, forgot: Forgot, as_json: bool) -> Result<(), Failure> {
    match forgot {
        Forgot::Forgot {
            status,
            fence,
            attempt,
        } => {
            print(
                as_json,
                json!({
                    "consumer": key.consumer(),
                    "message_id": key.message_id(),
                    "forgot": true,
                    "status": status.as_str(),
                    "fence": fence,
                    "attempt": attempt,
                }),
                || {
                    let state = match status {
                        // The attempt that found none left is the record's attempt number.
                        Status::DeadLettered => format!(
                            "dead-lettered after {} attempts",
                            attempt.saturating_sub(1)
                        ),
                        other => other.as_str().to_owned(),
                    };
                    format!(
                        "forgot {} ({state}, fence {fence}, attempt {attempt}): the next delivery \
                         is processed as new, with fence 1{}",
                        line(&key.to_string()),
                        if status == Status::InFlight {
                            "; the worker that held it gets LeaseLost"
                        } else {
                            ""
                        }
                    )
                },
            );
            Ok(())
        }
        Forgot::LiveLease {
            expires_at,
            attempt,
        } => Err(Failure::new(format!(
            "{key} is held by a live lease (attempt {attempt}, expires {}): not forgotten",
            utc(expires_at)
        ))
        .hint(
            "wait for it to expire, or pass --force if its worker is stuck \
             (that worker then gets LeaseLost at once)",
        )),
        Forgot::NotFound => Err(Failure::not_found(format!("no record for {key}"))
            .hint("check the consumer with `dedup consumers` and the message id with `dedup list --consumer`")),
    }
}
