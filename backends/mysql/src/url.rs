//! `mysql://` and `mariadb://` URLs: [`DESCRIPTOR`] parses them into a [`MySqlTarget`]
//! (dedup's own parameters into [`MySqlConfig`], the driver's passed through), which opens
//! the store (or its outbox).

use std::sync::Arc;

use dedup_core::backend::url::{BackendDescriptor, StoreTarget, UrlError, UrlParts};
use dedup_core::outbox::OutboxStore;
use dedup_sql::config::SqlConfig;
use dedup_sql::target::{SqlTarget, TlsModeParam, UrlStore, finish};
use dedup_sql::url_params::UrlParams;

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
};

/// Parameters of `mysql://` and `mariadb://` URLs: dedup's own, then the driver's (passed
/// through).
static PARAMS: UrlParams = UrlParams::new(
    &[],
    &[
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
    ],
);

/// What a `mysql://` or `mariadb://` URL opens: the driver's URL and the store's configuration.
pub type MySqlTarget = SqlTarget<MySqlStore>;

/// `ssl-mode` (or `sslmode`), MySQL's names for its modes, in any case.
const SSL_MODE: TlsModeParam = TlsModeParam {
    names: &["ssl-mode", "sslmode"],
    plain: &["DISABLED", "PREFERRED"],
    tls: &["REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY"],
    ignore_case: true,
};

/// `mysql://` or `mariadb://` (the driver is given `mysql://`).
fn parse(url: &UrlParts<'_>) -> std::result::Result<StoreTarget, UrlError> {
    let base = url.server_url("mysql", "MySQL")?;
    let mut params = PARAMS.parse(url.query, "mysql")?;
    let config = MySqlConfig::from_params(&mut params)?;
    let ssl_mode = SSL_MODE.take(&mut params, cfg!(feature = "tls"))?;
    finish::<MySqlStore>(base, params, config, ssl_mode)
}

impl UrlStore for MySqlStore {
    const TARGET: &'static str = "MySqlTarget";

    const DESCRIPTOR: &'static BackendDescriptor = &DESCRIPTOR;

    fn outbox_store(&self) -> Arc<dyn OutboxStore> {
        Arc::new(self.outbox())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> std::result::Result<MySqlTarget, UrlError> {
        dedup_sql::target::parse_target(&DESCRIPTOR, url)
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
