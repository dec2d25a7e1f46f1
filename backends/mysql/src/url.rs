//! `mysql://` and `mariadb://` URLs: [`DESCRIPTOR`] parses them into a [`MySqlTarget`]
//! (dedup's own parameters into [`MySqlConfig`], the driver's passed through), which opens
//! the store (or its outbox).

use std::sync::Arc;

use async_trait::async_trait;
use dedup_core::backend::url::{
    BackendDescriptor, OpenTarget, Params, StoreTarget, UrlError, UrlParts, boolean, count,
    duration, env_url, invalid, redact, tls_available, with_query,
};
use dedup_core::outbox::OutboxStore;
use dedup_core::{Admin, Clock, Result};

use crate::{MySqlConfig, MySqlStore};

/// The MySQL / MariaDB backend's part in store URLs (`mysql://`, `mariadb://`), for the
/// `dedup` facade's registry.
pub static DESCRIPTOR: BackendDescriptor = BackendDescriptor {
    name: "mysql",
    schemes: &["mysql", "mariadb"],
    forms: &[
        "mysql://USER:PASSWORD@HOST/DB",
        "mariadb://USER:PASSWORD@HOST/DB",
    ],
    parse,
    has_schema: true,
    has_outbox: true,
    test_urls: || env_url("DEDUP_MYSQL_URL").into_iter().collect(),
};

/// Parameters of `mysql://` and `mariadb://` URLs: dedup's own, then the driver's (passed
/// through).
const PARAMS: &[&str] = &[
    "table",
    "pool_size",
    "acquire_timeout",
    "clock",
    "connect_timeout",
    "migrate",
    "ssl-mode",
    "sslmode",
    "ssl-ca",
    "sslca",
    "ssl-cert",
    "sslcert",
    "ssl-key",
    "sslkey",
    "charset",
    "collation",
    "statement-cache-capacity",
    "socket",
    "timezone",
    "time-zone",
];

/// What a `mysql://` or `mariadb://` URL opens.
#[derive(Clone)]
pub struct MySqlTarget {
    /// The connection URL handed to the driver (`mysql://`, dedup's own parameters
    /// removed; it may hold a password: do not print it, [`redact`] it).
    pub url: String,
    /// The store's configuration.
    pub config: MySqlConfig,
}

impl std::fmt::Debug for MySqlTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlTarget")
            .field("url", &redact(&self.url))
            .field("config", &self.config)
            .finish()
    }
}

/// `mysql://` or `mariadb://` (the driver is given `mysql://`).
fn parse(url: &UrlParts<'_>) -> std::result::Result<StoreTarget, UrlError> {
    let base = url.server_url("mysql", "MySQL")?;
    let mut params = Params::parse(url.query, "mysql", PARAMS)?;
    let mut config = MySqlConfig {
        clock: params.server_or_local_clock()?,
        ..MySqlConfig::default()
    };
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
    let mut ssl_mode = None;
    for name in ["ssl-mode", "sslmode"] {
        if let Some(mode) = params.take(name) {
            let tls = match mode.to_ascii_uppercase().as_str() {
                "DISABLED" | "PREFERRED" => false,
                "REQUIRED" | "VERIFY_CA" | "VERIFY_IDENTITY" => true,
                _ => {
                    return Err(invalid(
                        name,
                        &mode,
                        "expected DISABLED, PREFERRED, REQUIRED, VERIFY_CA or VERIFY_IDENTITY",
                    ));
                }
            };
            tls_available(tls, cfg!(feature = "tls"))?;
            ssl_mode = Some(mode);
        }
    }
    config.validate().map_err(UrlError::Config)?;
    let mut driver = params.rest();
    if let Some(mode) = ssl_mode {
        let pair = format!("ssl-mode={mode}");
        driver = Some(match driver {
            Some(q) => format!("{q}&{pair}"),
            None => pair,
        });
    }
    Ok(StoreTarget::new(MySqlTarget {
        url: with_query(base, driver),
        config,
    }))
}

#[async_trait]
impl OpenTarget for MySqlTarget {
    fn descriptor(&self) -> &'static BackendDescriptor {
        &DESCRIPTOR
    }

    fn location(&self) -> String {
        format!("table {}", self.config.table)
    }

    fn set_clock(&mut self, clock: Arc<dyn Clock>) {
        self.config.clock = Some(clock);
    }

    fn clone_target(&self) -> Box<dyn OpenTarget> {
        Box::new(self.clone())
    }

    async fn open_admin(self: Box<Self>) -> Result<Arc<dyn Admin>> {
        Ok(Arc::new(
            MySqlStore::connect_with(&self.url, self.config).await?,
        ))
    }

    async fn open_outbox(self: Box<Self>) -> Result<Arc<dyn OutboxStore>> {
        let store = MySqlStore::connect_with(&self.url, self.config).await?;
        Ok(Arc::new(store.outbox()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> std::result::Result<MySqlTarget, UrlError> {
        let target = parse(&UrlParts::split(url).unwrap())?;
        Ok(target.downcast::<MySqlTarget>().unwrap())
    }

    #[test]
    fn mariadb_is_given_to_the_driver_as_mysql() {
        let t =
            target("mariadb://u:pw@h/db?table=t&acquire_timeout=750ms&charset=utf8mb4").unwrap();
        assert_eq!(t.url, "mysql://u:pw@h/db?charset=utf8mb4");
        assert_eq!(t.config.table, "t");
        assert_eq!(
            t.config.acquire_timeout,
            std::time::Duration::from_millis(750)
        );
        assert!(!format!("{t:?}").contains(":pw@"), "{t:?}");
    }

    #[test]
    fn bad_urls() {
        assert!(matches!(
            target("mysql:h/db"),
            Err(UrlError::Malformed { .. })
        ));
        assert!(matches!(
            target("mysql://h/db?schema=a"),
            Err(UrlError::UnknownParameter { .. })
        ));
        assert!(matches!(
            target("mysql://h/db?ssl-mode=maybe"),
            Err(UrlError::InvalidParameter { .. })
        ));
        assert!(matches!(
            target("mysql://h/db?acquire_timeout=0ms"),
            Err(UrlError::Config(_))
        ));
    }
}
