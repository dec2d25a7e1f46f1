//! `postgres://` and `postgresql://` URLs: [`DESCRIPTOR`] parses them into a
//! [`PostgresTarget`] (dedup's own parameters into [`PostgresConfig`], the driver's passed
//! through), which opens the store (or its outbox).

use std::sync::Arc;

use dedup_core::backend::url::{
    BackendDescriptor, Params, StoreTarget, UrlError, UrlParts, count, duration, invalid, on_off,
};
use dedup_core::outbox::OutboxStore;
use dedup_sql::config::SqlConfig;
use dedup_sql::target::{SqlTarget, TlsModeParam, UrlStore, finish};
use dedup_sql::url_params::UrlParams;

use crate::{GroupCommit, Partitions, PostgresConfig, PostgresStore};

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
        "partitions",
        "partition_window",
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
    config.partitions = partitions(&mut params)?;
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

/// `partitions=N&partition_window=D` (both or neither): the partitioned layout
/// ([`PostgresConfig::partitions`]).
fn partitions(params: &mut Params) -> std::result::Result<Option<Partitions>, UrlError> {
    let (count_text, window_text) = (params.take("partitions"), params.take("partition_window"));
    let (count_text, window_text) = match (count_text, window_text) {
        (None, None) => return Ok(None),
        (Some(c), Some(w)) => (c, w),
        (Some(c), None) => {
            return Err(invalid(
                "partitions",
                &c,
                "needs partition_window too (the time one partition covers, e.g. 1d)",
            ));
        }
        (None, Some(w)) => {
            return Err(invalid(
                "partition_window",
                &w,
                "needs partitions too (how many partitions the ring has, e.g. 9)",
            ));
        }
    };
    let count = count(&count_text).map_err(|e| invalid("partitions", &count_text, &e))?;
    let window =
        duration(&window_text).map_err(|e| invalid("partition_window", &window_text, &e))?;
    let partitions = Partitions {
        window,
        count: u16::try_from(count).unwrap_or(u16::MAX),
    };
    partitions
        .validate()
        .map_err(|e| invalid("partitions", &count_text, &e.to_string()))?;
    Ok(Some(partitions))
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
    fn partitions_come_as_a_count_and_a_window() {
        let t = target("postgres://h/db?partitions=9&partition_window=1d").unwrap();
        assert_eq!(
            t.config.partitions,
            Some(Partitions {
                window: std::time::Duration::from_secs(86_400),
                count: 9
            })
        );
        assert_eq!(target("postgres://h/db").unwrap().config.partitions, None);
        for (url, name) in [
            ("postgres://h/db?partitions=9", "partitions"),
            ("postgres://h/db?partition_window=1d", "partition_window"),
            (
                "postgres://h/db?partitions=2&partition_window=1d",
                "partitions",
            ),
            (
                "postgres://h/db?partitions=9&partition_window=soon",
                "partition_window",
            ),
        ] {
            match target(url) {
                Err(UrlError::InvalidParameter { name: n, .. }) => assert_eq!(n, name, "{url}"),
                other => panic!("{url}: {other:?}"),
            }
        }
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
