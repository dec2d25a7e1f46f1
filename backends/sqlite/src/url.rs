//! `sqlite:PATH` and `sqlite::memory:` URLs: [`DESCRIPTOR`] parses them into a
//! [`SqliteTarget`], which opens the store (or its outbox).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use dedup_core::backend::url::{
    BackendDescriptor, OpenTarget, Params, StoreTarget, UrlError, UrlParts, boolean, count,
    duration, malformed,
};
use dedup_core::outbox::OutboxStore;
use dedup_core::{Admin, Clock, Result};

use crate::{SqliteConfig, SqliteStore, Synchronous};

/// The SQLite backend's part in store URLs (`sqlite:PATH`, `sqlite::memory:`), for the
/// `dedup` facade's registry.
pub static DESCRIPTOR: BackendDescriptor = BackendDescriptor {
    name: "sqlite",
    schemes: &["sqlite"],
    forms: &["sqlite:PATH", "sqlite::memory:"],
    parse,
    has_schema: true,
    has_outbox: true,
};

/// Parameters of `sqlite:` URLs.
const PARAMS: &[&str] = &[
    "table",
    "synchronous",
    "pool_size",
    "busy_timeout",
    "block_in_place",
    "clock",
    "migrate",
];

/// What a `sqlite:` URL opens.
#[derive(Clone, Debug)]
pub struct SqliteTarget {
    /// The database file; `None`: a private in-memory database.
    pub path: Option<PathBuf>,
    /// The store's configuration.
    pub config: SqliteConfig,
}

fn parse(url: &UrlParts<'_>) -> std::result::Result<StoreTarget, UrlError> {
    let path = url.rest.strip_prefix("//").unwrap_or(url.rest);
    let path = match path {
        "" => {
            return Err(malformed(
                "sqlite: needs a file path (sqlite:inbox.db, sqlite:/var/lib/app/inbox.db) \
                 or sqlite::memory:",
            ));
        }
        ":memory:" => None,
        p => Some(PathBuf::from(p)),
    };
    let mut params = Params::parse(url.query, "sqlite", PARAMS)?;
    let mut config = SqliteConfig {
        clock: params.local_clock()?,
        ..SqliteConfig::default()
    };
    if let Some(table) = params.take("table") {
        config.table = table;
    }
    if let Some(sync) =
        params.take_with("synchronous", |v| match v.to_ascii_lowercase().as_str() {
            "full" => Ok(Synchronous::Full),
            "normal" => Ok(Synchronous::Normal),
            _ => Err("expected full or normal".to_owned()),
        })?
    {
        config.synchronous = sync;
    }
    if let Some(n) = params.take_with("pool_size", count)? {
        config.pool_size = n as usize;
    }
    if let Some(t) = params.take_with("busy_timeout", duration)? {
        config.busy_timeout = t;
    }
    if let Some(in_place) = params.take_with("block_in_place", boolean)? {
        config.block_in_place = in_place;
    }
    if let Some(migrate) = params.take_with("migrate", boolean)? {
        config.migrate = migrate;
    }
    config.validate().map_err(UrlError::Config)?;
    Ok(StoreTarget::new(SqliteTarget { path, config }))
}

impl SqliteTarget {
    async fn open(self) -> Result<SqliteStore> {
        match self.path {
            Some(path) => SqliteStore::open_with(path, self.config).await,
            None => SqliteStore::open_in_memory_with(self.config).await,
        }
    }
}

#[async_trait]
impl OpenTarget for SqliteTarget {
    fn descriptor(&self) -> &'static BackendDescriptor {
        &DESCRIPTOR
    }

    fn location(&self) -> String {
        let file = self
            .path
            .as_ref()
            .map_or(":memory:".into(), |p| p.display().to_string());
        format!("{file}, table {}", self.config.table)
    }

    fn file(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn set_clock(&mut self, clock: Arc<dyn Clock>) {
        self.config.clock = Some(clock);
    }

    fn clone_target(&self) -> Box<dyn OpenTarget> {
        Box::new(self.clone())
    }

    async fn open_admin(self: Box<Self>) -> Result<Arc<dyn Admin>> {
        Ok(Arc::new(self.open().await?))
    }

    async fn open_outbox(self: Box<Self>) -> Result<Arc<dyn OutboxStore>> {
        Ok(Arc::new(self.open().await?.outbox()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> std::result::Result<SqliteTarget, UrlError> {
        let target = parse(&UrlParts::split(url).unwrap())?;
        Ok(target.downcast::<SqliteTarget>().unwrap())
    }

    #[test]
    fn paths_and_parameters() {
        let t = target("sqlite:/tmp/a.db?table=t1&synchronous=NORMAL&pool_size=2").unwrap();
        assert_eq!(t.path.as_deref(), Some(Path::new("/tmp/a.db")));
        assert_eq!(t.config.table, "t1");
        assert_eq!(t.config.synchronous, Synchronous::Normal);
        assert_eq!(t.config.pool_size, 2);
        assert_eq!(t.location(), "/tmp/a.db, table t1");
        assert!(target("sqlite::memory:").unwrap().path.is_none());
        assert_eq!(
            target("sqlite:///tmp/b.db").unwrap().path.as_deref(),
            Some(Path::new("/tmp/b.db"))
        );
    }

    #[test]
    fn bad_urls() {
        assert!(matches!(target("sqlite:"), Err(UrlError::Malformed { .. })));
        assert!(matches!(
            target("sqlite:x.db?clock=server"),
            Err(UrlError::InvalidParameter { .. })
        ));
        assert!(matches!(
            target("sqlite:x.db?schema=s"),
            Err(UrlError::UnknownParameter { .. })
        ));
        assert!(matches!(
            target("sqlite:x.db?table=drop table"),
            Err(UrlError::Config(_))
        ));
    }
}
