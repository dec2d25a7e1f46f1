//! `dedup inspect`: one record, human readable.

use crate::StoreArgs;
use crate::failure::Failure;
use crate::open::{Access, Opened, open};
use crate::render::{print, record_json, record_text};

use super::{key, now};

/// Show the record of `consumer` / `message_id`.
pub(super) async fn run(
    args: &StoreArgs,
    as_json: bool,
    consumer: &str,
    message_id: &str,
) -> Result<(), Failure> {
    let Opened { store, .. } = open(args, Access::Read).await?;
    let key = key(consumer, message_id)?;
    let now = now(&*store).await?;
    let record = store
        .get(&key)
        .await
        .map_err(|e| Failure::store(format!("cannot read the record of {key}"), e))?
        .ok_or_else(|| {
            Failure::not_found(format!("no record for {key}")).hint(
                "the message was never claimed by this consumer, or its record was purged \
                     (the store's consumers: `dedup consumers`)",
            )
        })?;
    print(as_json, record_json(&record, now), || {
        record_text(&record, now)
    });
    Ok(())
}
