//! `dedup consumers`: the consumers the store holds records of, with their records counted
//! by state.

use dedup_core::Status;
use serde_json::json;

use crate::StoreArgs;
use crate::failure::Failure;
use crate::open::{Access, Opened, open};
use crate::render::print;
use crate::screen::line;

/// Show the store's consumers and their counts.
pub(super) async fn run(args: &StoreArgs, as_json: bool) -> Result<(), Failure> {
    let Opened { store, .. } = open(args, Access::Read).await?;
    let consumers = store
        .consumers()
        .await
        .map_err(|e| Failure::store("cannot count the store's consumers", e))?;
    let json = json!({
        "consumers": consumers.iter().map(|c| {
            let mut counts = serde_json::Map::new();
            for status in Status::ALL {
                counts.insert(status.as_str().to_owned(), json!(c.counts.count(status)));
            }
            json!({ "consumer": c.consumer, "counts": counts, "total": c.counts.total() })
        }).collect::<Vec<_>>(),
    });
    print(as_json, json, || {
        let mut out = vec![format!(
            "{:<24} {:>9} {:>9} {:>9} {:>9} {:>11} {:>9}",
            "consumer", "in-flight", "expired", "processed", "failed", "dead-letter", "total"
        )];
        for c in &consumers {
            let n = |s| c.counts.count(s);
            out.push(format!(
                "{:<24} {:>9} {:>9} {:>9} {:>9} {:>11} {:>9}",
                line(&c.consumer),
                n(Status::InFlight),
                n(Status::Expired),
                n(Status::Completed),
                n(Status::Failed),
                n(Status::DeadLettered),
                c.counts.total()
            ));
        }
        if consumers.is_empty() {
            out.push("no records in this store".into());
        }
        out.join("\n")
    });
    Ok(())
}
