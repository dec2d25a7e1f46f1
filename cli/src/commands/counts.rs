//! `dedup counts enable|disable|status`: the store's kept counts (`Admin::enable_counts`),
//! which make `stats`, `consumers` and the console's overview read counts the store keeps
//! instead of every record, at a cost on every consumer's write (see the backend's README).

use dedup_core::CountSource;
use serde_json::json;

use crate::failure::Failure;
use crate::open::{Access, Opened, open};
use crate::render::print;
use crate::{CountsCommand, StoreArgs};

/// Run `dedup counts <command>`.
pub(crate) async fn run(
    args: &StoreArgs,
    as_json: bool,
    command: CountsCommand,
) -> Result<(), Failure> {
    // Enabling and disabling change the schema, so the store opens as a writer's does.
    let access = match command {
        CountsCommand::Status => Access::Read,
        CountsCommand::Enable | CountsCommand::Disable => Access::Write,
    };
    let Opened {
        store,
        backend,
        location,
        ..
    } = open(args, access).await?;
    let (changed, doing) = match command {
        CountsCommand::Status => (None, "cannot tell where the counts come from"),
        CountsCommand::Enable => (
            Some(store.enable_counts().await),
            "cannot enable kept counts",
        ),
        CountsCommand::Disable => (
            Some(store.disable_counts().await),
            "cannot disable kept counts",
        ),
    };
    let changed = changed.transpose().map_err(|e| {
        let unsupported = matches!(e, dedup_core::Error::Unsupported(_));
        let failure = Failure::store(doing, e);
        match unsupported {
            true => failure.hint(unsupported_hint(backend)),
            false => failure,
        }
    })?;
    let source = store
        .count_source()
        .await
        .map_err(|e| Failure::store("cannot tell where the counts come from", e))?;
    let said = match (changed, source) {
        (Some(true), CountSource::Kept) => "now kept: counts read the kept counts",
        (Some(false), CountSource::Kept) => "already kept: nothing changed",
        (Some(true), _) => "no longer kept: counts read every record",
        (Some(false), _) => "were not kept: nothing changed",
        (None, CountSource::Kept) => "kept: counts read the kept counts",
        (None, CountSource::Scan { keepable: true }) => {
            "not kept: counts read every record (`dedup counts enable` keeps them)"
        }
        (None, CountSource::Scan { keepable: false }) => {
            "not kept: counts read every record (this store cannot keep them)"
        }
    };
    print(
        as_json,
        json!({
            "backend": backend,
            "location": location,
            "source": source.as_str(),
            "changed": changed,
        }),
        || format!("{backend} store, {location}: counts {said}"),
    );
    Ok(())
}

/// What to tell an operator whose store cannot keep counts.
fn unsupported_hint(backend: &str) -> String {
    format!(
        "kept counts exist on SQLite, PostgreSQL and MySQL / MariaDB stores; a {backend} store's counts read every record"
    )
}
