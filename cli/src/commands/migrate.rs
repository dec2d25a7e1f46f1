//! `dedup migrate`: create the store's table, or upgrade its schema.

use serde_json::json;

use crate::StoreArgs;
use crate::failure::Failure;
use crate::open::{Access, Opened, open};
use crate::render::print;

/// Create or upgrade the schema, and say which.
pub(super) async fn run(args: &StoreArgs, as_json: bool) -> Result<(), Failure> {
    // The store stays open until the answer is printed, as for every command.
    let Opened {
        store: _store,
        backend,
        location,
        has_schema,
    } = open(args, Access::Migrate).await?;
    let what = if has_schema {
        "schema created or already up to date"
    } else {
        "nothing to migrate: this store keeps no schema"
    };
    print(
        as_json,
        json!({ "backend": backend, "location": location, "migrated": true }),
        || format!("{backend} store, {location}: {what}"),
    );
    Ok(())
}
