//! Opening the store a URL names, as an [`Admin`] handle, through the `dedup` crate's one
//! front door ([`StoreUrl::parse_with`] then [`StoreUrl::open_admin`]): the command line
//! knows no backend. `--table`, `--schema` and `--prefix` replace the URL's parameters of
//! the same name, checked as if written in the URL (a backend without that notion refuses
//! it).
//!
//! A database file (SQLite's) must already exist unless the command is `dedup migrate` (opening an
//! SQLite file creates the table in it, so a mistyped path would otherwise leave an empty
//! database behind). Commands that only read (`stats`, `inspect`, `list`, `purge
//! --dry-run`) open SQL stores with `migrate=false`: they create and upgrade nothing (a
//! read-only role can run them), and a missing or older table is an error naming `dedup
//! migrate`. The commands that write create or upgrade the table when opening it, as every
//! store does by default; Redis has no schema.

use std::sync::Arc;

use dedup::outbox::OutboxStore;
use dedup::{Admin, StoreUrl, UrlError};

use crate::StoreArgs;
use crate::failure::Failure;

/// An opened store and a line describing it for people.
pub(crate) struct Opened {
    /// The store.
    pub(crate) store: Arc<dyn Admin>,
    /// The backend's name (`sqlite`, `postgres`, `mysql`, `redis`, `redis-cluster`, `memory`).
    pub(crate) backend: &'static str,
    /// Where the records are: a table, a key prefix.
    pub(crate) location: String,
    /// Whether the store has a schema to migrate (its backend's descriptor says).
    pub(crate) has_schema: bool,
}

/// How a command uses the store: what opening it may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// `dedup migrate`: may create the SQLite file; creates or upgrades the schema.
    Migrate,
    /// A command that writes records: creates or upgrades the schema (the stores' default).
    Write,
    /// A command that only reads: never creates or upgrades a schema.
    Read,
}

/// Open the store `args` name, as `access` allows.
pub(crate) async fn open(args: &StoreArgs, access: Access) -> Result<Opened, Failure> {
    let parsed = parse(args, access)?;
    let backend = parsed.backend();
    let location = parsed.location();
    let has_schema = parsed.descriptor().has_schema;
    let store = parsed.open_admin().await.map_err(|e| opening(backend, e))?;
    Ok(Opened {
        store,
        backend,
        location,
        has_schema,
    })
}

/// The outbox of the store `args` name, as `access` allows (`dedup outbox ...`).
pub(crate) async fn open_outbox(
    args: &StoreArgs,
    access: Access,
) -> Result<(Arc<dyn OutboxStore>, &'static str), Failure> {
    let parsed = parse(args, access)?;
    let backend = parsed.backend();
    let outbox = parsed
        .open_outbox()
        .await
        .map_err(|e| match e.url_problem() {
            Some(UrlError::NoOutbox { .. }) => {
                Failure::usage(format!("the {backend} store has no outbox"))
                    .cause(e)
                    .hint(format!(
                        "the outbox lives in these stores: pass a {} URL",
                        forms(|d| d.has_outbox && d.has_schema).join(" or ")
                    ))
            }
            _ => opening(backend, e),
        })?;
    Ok((outbox, backend))
}

/// The URL forms of the backends this build has that `keep` accepts, for hints.
fn forms(keep: impl Fn(&dedup::url::BackendDescriptor) -> bool) -> Vec<&'static str> {
    dedup::url::backends()
        .filter(|d| keep(d))
        .flat_map(|d| d.forms.iter().copied())
        .collect()
}

/// Why the store could not be opened.
fn opening(backend: &str, e: dedup::OpenError) -> Failure {
    match e {
        dedup::OpenError::Store { source, .. } => {
            Failure::store(format!("cannot open the {backend} store"), source)
        }
        other => Failure::new(format!("cannot open the {backend} store")).cause(other),
    }
}

/// The URL `args` give, checked, with the overrides and the access's `migrate`.
fn parse(args: &StoreArgs, access: Access) -> Result<StoreUrl, Failure> {
    let Some(url) = &args.url else {
        return Err(Failure::usage("no store given").hint(format!(
            "pass --store URL or set DEDUP_STORE_URL ({})",
            forms(|d| d.name != "memory").join(", ")
        )));
    };
    let mut overrides: Vec<(&str, &str)> = [
        ("table", &args.table),
        ("schema", &args.schema),
        ("prefix", &args.prefix),
    ]
    .into_iter()
    .filter_map(|(name, value)| value.as_deref().map(|v| (name, v)))
    .collect();
    let parse = |overrides: &[(&str, &str)]| {
        StoreUrl::parse_with(url, overrides).map_err(|e| {
            let code = if e.url_problem().is_some() {
                Failure::usage
            } else {
                Failure::new
            };
            code("cannot use the store URL")
                .cause(e)
                .hint("see `dedup --help` and the dedup crate's README for the URL forms")
        })
    };
    let mut parsed = parse(&overrides)?;
    if access == Access::Read && parsed.descriptor().has_schema {
        overrides.push(("migrate", "false"));
        parsed = parse(&overrides)?;
    }
    if let Some(path) = parsed.file()
        && access != Access::Migrate
        && !path.exists()
    {
        return Err(
            Failure::not_found(format!("no database file at {}", path.display()))
                .hint("check the path, or create the store with `dedup migrate`"),
        );
    }
    Ok(parsed)
}
