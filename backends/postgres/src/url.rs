//! `postgres://` and `postgresql://` URLs: [`DESCRIPTOR`] parses them into a
//! [`PostgresTarget`] (dedup's own parameters into [`PostgresConfig`], the driver's passed
//! through), which opens the store (or its outbox).

use std::sync::Arc;

use dedup_core::backend::url::{
    BackendDescriptor, Params, StoreTarget, UrlError, UrlParts, count, invalid, on_off,
};
use dedup_core::outbox::OutboxStore;
use dedup_sql::config::SqlConfig;
use dedup_sql::target::{SqlTarget, TlsModeParam, UrlStore, finish};
use dedup_sql::url_params::UrlParams;

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
};

/// Parameters of `postgres://` URLs: dedup's own, then the driver's (passed through).
static PARAMS: UrlParams = UrlParams::new(
    &["schema"],
    &[
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
    ],
);

/// What a `postgres://` URL opens: the driver's URL and the store's configuration.
pub type PostgresTarget = SqlTarget<PostgresStore>;

/// `sslmode`, libpq's names for its modes.
const SSL_MODE: TlsModeParam = TlsModeParam {
    names: &["sslmode"],
    plain: &["disable", "allow", "prefer"],
    tls: &["require", "verify-ca", "verify-full"],
    ignore_case: false,
};

fn parse(url: &UrlParts<'_>) -> std::result::Result<StoreTarget, UrlError> {
    let base = url.server_url(url.scheme, "PostgreSQL")?;
    let mut params = PARAMS.parse(url.query, "postgres")?;
    let mut config = PostgresConfig::from_params(&mut params)?;
    if let Some(schema) = params.take("schema") {
        config.schema = schema;
    }
    config.group_commit = group_commit(&mut params)?;
    let sslmode = SSL_MODE.take(&mut params, cfg!(feature = "tls"))?;
    finish::<PostgresStore>(base, params, config, sslmode)
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

impl UrlStore for PostgresStore {
    const TARGET: &'static str = "PostgresTarget";

    const DESCRIPTOR: &'static BackendDescriptor = &DESCRIPTOR;

    fn outbox_store(&self) -> Arc<dyn OutboxStore> {
        Arc::new(self.outbox())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dedup_core::backend::url::OpenTarget;

    fn target(url: &str) -> std::result::Result<PostgresTarget, UrlError> {
        dedup_sql::target::parse_target(&DESCRIPTOR, url)
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
