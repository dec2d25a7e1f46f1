//! `dedup release`: release a stuck key's lease so the next delivery retries it at once.

use dedup_core::Released;
use serde_json::json;

use crate::StoreArgs;
use crate::failure::Failure;
use crate::open::{Access, Opened, open};
use crate::render::{print, utc};
use crate::screen::line;

use super::key;

/// Release the lease of `consumer` / `message_id` (a live one too with `force`).
pub(super) async fn run(
    args: &StoreArgs,
    as_json: bool,
    consumer: &str,
    message_id: &str,
    force: bool,
) -> Result<(), Failure> {
    let Opened { store, .. } = open(args, Access::Write).await?;
    let key = key(consumer, message_id)?;
    let released = store
        .release_key(&key, force)
        .await
        .map_err(|e| Failure::store(format!("cannot release {key}"), e))?;
    match released {
        Released::Released {
            fence,
            attempt,
            was_live,
        } => print(
            as_json,
            json!({
                "consumer": key.consumer(),
                "message_id": key.message_id(),
                "released": true,
                "fence": fence,
                "attempt": attempt,
                "was_live": was_live,
            }),
            || {
                format!(
                    "released {} (fence {fence}, attempt {attempt}{}): the next \
                         delivery takes it over with fence {}",
                    line(&key.to_string()),
                    if was_live { ", lease was live" } else { "" },
                    fence + 1
                )
            },
        ),
        Released::LiveLease {
            expires_at,
            attempt,
        } => {
            return Err(Failure::new(format!(
                "{key} is held by a live lease (attempt {attempt}, expires {})",
                utc(expires_at)
            ))
            .hint(
                "wait for it to expire, or pass --force if its worker is stuck \
                     (that worker then gets LeaseLost at once)",
            ));
        }
        Released::Completed { processed_at } => {
            return Err(Failure::new(format!(
                "{key} is completed (processed {}): there is no lease to release",
                utc(processed_at)
            ))
            .hint(format!(
                "a completed message is not processed again; to let it run once more \
                     (a dead-lettered message, after the fix), remove its record: \
                     `dedup forget {} {}`",
                key.consumer(),
                key.message_id()
            )));
        }
        Released::NotFound => {
            return Err(Failure::not_found(format!("no record for {key}"))
                    .hint("check the consumer with `dedup consumers` and the message id with `dedup list --consumer`"));
        }
    }
    Ok(())
}
