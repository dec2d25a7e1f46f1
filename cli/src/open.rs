//! Opening the store a URL names, as an [`Admin`] handle, through the `dedup` crate's one
//! front door ([`StoreUrl::parse_with`] then [`StoreUrl::open_admin`]): the command line
//! knows no backend. `--table`, `--schema` and `--prefix` replace the URL's parameters of
//! the same name, checked as if written in the URL (a backend without that notion refuses
//! it).
//!
//! An SQLite path must already exist unless the command is `dedup migrate` (opening an
//! SQLite file creates the table in it, so a mistyped path would otherwise leave an empty
//! database behind). PostgreSQL stores create or upgrade their table when opened, as every
//! `PostgresStore` does; Redis has no schema.

use std::sync::Arc;

use dedup::{Admin, StoreUrl};

use crate::StoreArgs;
use crate::failure::Failure;

/// An opened store and a line describing it for people.
pub(crate) struct Opened {
    /// The store.
    pub(crate) store: Arc<dyn Admin>,
    /// The backend's name (`sqlite`, `postgres`, `redis`, `redis-cluster`, `memory`).
    pub(crate) backend: &'static str,
    /// Where the records are: a table, a key prefix.
    pub(crate) location: String,
}

/// Open the store `args` name; with `migrate`, create or upgrade its schema first.
pub(crate) async fn open(args: &StoreArgs, migrate: bool) -> Result<Opened, Failure> {
    let Some(url) = &args.url else {
        return Err(Failure::usage("no store given").hint(
            "pass --store URL or set DEDUP_STORE_URL (sqlite:PATH, postgres://..., redis://...)",
        ));
    };
    let overrides: Vec<(&str, &str)> = [
        ("table", &args.table),
        ("schema", &args.schema),
        ("prefix", &args.prefix),
    ]
    .into_iter()
    .filter_map(|(name, value)| value.as_deref().map(|v| (name, v)))
    .collect();
    let parsed = StoreUrl::parse_with(url, &overrides).map_err(|e| {
        let code = if e.url_problem().is_some() {
            Failure::usage
        } else {
            Failure::new
        };
        code("cannot use the store URL")
            .cause(e)
            .hint("see `dedup --help` and the dedup crate's README for the URL forms")
    })?;
    if let Some(path) = parsed.file()
        && !migrate
        && !path.exists()
    {
        return Err(
            Failure::not_found(format!("no SQLite database at {}", path.display()))
                .hint("check the path, or create the store with `dedup migrate`"),
        );
    }
    let backend = parsed.backend();
    let location = parsed.location();
    let store = parsed.open_admin().await.map_err(|e| match e {
        dedup::OpenError::Store { source, .. } => {
            Failure::store(format!("cannot open the {backend} store"), source)
        }
        other => Failure::new(format!("cannot open the {backend} store")).cause(other),
    })?;
    Ok(Opened {
        store,
        backend,
        location,
    })
}
