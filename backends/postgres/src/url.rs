//! `postgres://` and `postgresql://` URLs: [`DESCRIPTOR`] parses them into a
//! [`PostgresTarget`] (dedup's own parameters into [`PostgresConfig`], the driver's passed
//! through), which opens the store (or its outbox).

use std::sync::Arc;

use async_trait::async_trait;
use dedup_core::backend::url::{
    BackendDescriptor, OpenTarget, Params, StoreTarget, UrlError, UrlParts, boolean, count,
    duration, env_url, invalid, on_off, redact, tls_available, with_query,
};
use dedup_core::outbox::OutboxStore;
use dedup_core::{Admin, Clock, Result};

use crate::{GroupCommit, PostgresConfig, PostgresStore};

/// The PostgreSQL backend's part in store URLs (`postgres://`, `postgresql://`), for the
/// `dedup` facade's registry.
pub static DESCRIPTOR: BackendDescriptor = BackendDescriptor {
    name: "postgres",
    schemes: &["postgres", "postgresql"],
    forms: &["postgres://USER:PASSWORD@HOST/DB"],
    parse,
    has_schema: true,
    has_outbox: true,
    test_urls: || env_url("DEDUP_POSTGRES_URL").into_iter().collect(),
};

/// Parameters of `postgres://` URLs: dedup's own, then the driver's (passed through).
const PARAMS: &[&str] = &[
    "schema",
    "table",
    "pool_size",
    "acquire_timeout",
    "clock",
    "connect_timeout",
    "migrate",
    "group_commit",
    "group_commit_rounds",
    "group_commit_max",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "application_name",
    "options",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "statement-cache-capacity",
];

/// What a `postgres://` URL opens.
#[derive(Clone)]
pub struct PostgresTarget {
    /// The connection URL handed to the driver (dedup's own parameters removed; it may
    /// hold a password: do not print it, [`redact`] it).
    pub url: String,
    /// The store's configuration.
    pub config: PostgresConfig,
}

impl std::fmt::Debug for PostgresTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresTarget")
            .field("url", &redact(&self.url))
            .field("config", &self.config)
            .finish()
    }
}

fn parse(url: &UrlParts<'_>) -> std::result::Result<StoreTarget, UrlError> {
    let base = url.server_url(url.scheme, "PostgreSQL")?;
    let mut params = Params::parse(url.query, "postgres", PARAMS)?;
    let mut config = PostgresConfig {
        clock: params.server_or_local_clock()?,
        ..PostgresConfig::default()
    };
    if let Some(schema) = params.take("schema") {
        config.schema = schema;
    }
    if let Some(table) = params.take("table") {
        config.table = table;
    }
    if let Some(n) = params.take_with("pool_size", count)? {
        config.max_connections = n;
    }
    if let Some(t) = params.take_with("acquire_timeout", duration)? {
        config.acquire_timeout = t;
    }
    if let Some(t) = params.take_with("connect_timeout", duration)? {
        config.connect_timeout = t;
    }
    if let Some(migrate) = params.take_with("migrate", boolean)? {
        config.migrate = migrate;
    }
    config.group_commit = group_commit(&mut params)?;
    let sslmode = params.take("sslmode");
    if let Some(mode) = &sslmode {
        let tls = match mode.as_str() {
            "disable" | "allow" | "prefer" => false,
            "require" | "verify-ca" | "verify-full" => true,
            _ => {
                return Err(invalid(
                    "sslmode",
                    mode,
                    "expected disable, allow, prefer, require, verify-ca or verify-full",
                ));
            }
        };
        tls_available(tls, cfg!(feature = "tls"))?;
    }
    config.validate().map_err(UrlError::Config)?;
    let mut driver = params.rest();
    if let Some(mode) = sslmode {
        let pair = format!("sslmode={mode}");
        driver = Some(match driver {
            Some(q) => format!("{q}&{pair}"),
            None => pair,
        });
    }
    Ok(StoreTarget::new(PostgresTarget {
        url: with_query(base, driver),
        config,
    }))
}

/// `group_commit=on|off`, `group_commit_rounds=N`, `group_commit_max=N` (either bound
/// alone turns it on; with `off` they are refused as contradictory).
fn group_commit(params: &mut Params) -> std::result::Result<Option<GroupCommit>, UrlError> {
    let on = params.take_with("group_commit", on_off)?;
    let rounds = params.take_with("group_commit_rounds", count)?;
    let max = params.take_with("group_commit_max", count)?;
    if on == Some(false) && (rounds.is_some() || max.is_some()) {
        return Err(invalid(
            "group_commit",
            "off",
            "group_commit_rounds / group_commit_max need group commit on",
        ));
    }
    if on == Some(false) {
        return Ok(None);
    }
    let mut group = GroupCommit::default();
    if let Some(n) = rounds {
        group.rounds = n as usize;
    }
    if let Some(n) = max {
        group.max_requests = n as usize;
    }
    Ok(Some(group))
}

#[async_trait]
impl OpenTarget for PostgresTarget {
    fn descriptor(&self) -> &'static BackendDescriptor {
        &DESCRIPTOR
    }

    fn location(&self) -> String {
        format!("table {}.{}", self.config.schema, self.config.table)
    }

    fn set_clock(&mut self, clock: Arc<dyn Clock>) {
        self.config.clock = Some(clock);
    }

    fn clone_target(&self) -> Box<dyn OpenTarget> {
        Box::new(self.clone())
    }

    async fn open_admin(self: Box<Self>) -> Result<Arc<dyn Admin>> {
        Ok(Arc::new(
            PostgresStore::connect_with(&self.url, self.config).await?,
        ))
    }

    async fn open_outbox(self: Box<Self>) -> Result<Arc<dyn OutboxStore>> {
        let store = PostgresStore::connect_with(&self.url, self.config).await?;
        Ok(Arc::new(store.outbox()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> std::result::Result<PostgresTarget, UrlError> {
        let target = parse(&UrlParts::split(url).unwrap())?;
        Ok(target.downcast::<PostgresTarget>().unwrap())
    }

    #[test]
    fn dedups_parameters_are_taken_and_the_drivers_passed_through() {
        let t = target(
            "postgres://u:pw@h/db?schema=s&table=t&pool_size=3&acquire_timeout=2s&application_name=x",
        )
        .unwrap();
        assert_eq!(
            (t.config.schema.as_str(), t.config.table.as_str()),
            ("s", "t")
        );
        assert_eq!(t.config.max_connections, 3);
        assert_eq!(t.config.acquire_timeout, std::time::Duration::from_secs(2));
        assert_eq!(t.url, "postgres://u:pw@h/db?application_name=x");
        assert!(!format!("{t:?}").contains("pw@"), "{t:?}");
        assert_eq!(t.location(), "table s.t");
    }

    #[test]
    fn group_commit_switches() {
        assert_eq!(
            target("postgres://h/db?group_commit=off")
                .unwrap()
                .config
                .group_commit,
            None
        );
        assert!(matches!(
            target("postgres://h/db?group_commit=off&group_commit_max=2"),
            Err(UrlError::InvalidParameter { .. })
        ));
        assert!(matches!(
            target("postgres:h/db"),
            Err(UrlError::Malformed { .. })
        ));
        assert!(matches!(
            target("postgres://h/db?acquire_timeout=0s"),
            Err(UrlError::Config(_))
        ));
    }
}
