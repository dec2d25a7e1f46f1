//! [`UrlParams`]: a sqlx backend's list of URL parameters. The ones every sqlx store
//! takes set its [`SqlSettings`]; they are named, in order, and read in one table here.

use std::sync::OnceLock;

use dedup_core::backend::url::{Params, UrlError, boolean, count, duration};

use crate::config::SqlSettings;

/// How a shared parameter sets the settings, when given.
type Take = fn(&mut Params, &mut SqlSettings) -> Result<(), UrlError>;

/// The URL parameters every sqlx store takes, in the order errors list them, each with
/// how it sets [`SqlSettings`].
const SHARED: [(&str, Take); 6] = [
    ("table", |params, s| {
        if let Some(table) = params.take("table") {
            s.table = table;
        }
        Ok(())
    }),
    ("pool_size", |params, s| {
        if let Some(n) = params.take_with("pool_size", count)? {
            s.max_connections = n;
        }
        Ok(())
    }),
    ("acquire_timeout", |params, s| {
        if let Some(t) = params.take_with("acquire_timeout", duration)? {
            s.acquire_timeout = t;
        }
        Ok(())
    }),
    ("clock", |params, s| {
        s.clock = params.server_or_local_clock()?;
        Ok(())
    }),
    ("connect_timeout", |params, s| {
        if let Some(t) = params.take_with("connect_timeout", duration)? {
            s.connect_timeout = t;
        }
        Ok(())
    }),
    ("migrate", |params, s| {
        if let Some(migrate) = params.take_with("migrate", boolean)? {
            s.migrate = migrate;
        }
        Ok(())
    }),
];

impl SqlSettings {
    /// The default settings with the URL parameters every sqlx store takes from `params`:
    /// `table`, `pool_size`, `acquire_timeout`, `clock`, `connect_timeout`, `migrate`.
    pub fn from_params(params: &mut Params) -> Result<Self, UrlError> {
        let mut settings = SqlSettings::default();
        for (_, take) in SHARED {
            take(params, &mut settings)?;
        }
        Ok(settings)
    }
}

/// A backend's URL parameters: its own that come first, the ones every sqlx store takes
/// ([`SqlSettings::from_params`]), then the rest of its own and the driver's. Keep it in
/// a `static`: [`Params::parse`] names the whole list, in this order, when it refuses an
/// unknown parameter.
#[derive(Debug)]
pub struct UrlParams {
    first: &'static [&'static str],
    rest: &'static [&'static str],
    all: OnceLock<Vec<&'static str>>,
}

impl UrlParams {
    /// The backend's own parameters `first`, the shared ones, then `rest`.
    pub const fn new(first: &'static [&'static str], rest: &'static [&'static str]) -> Self {
        UrlParams {
            first,
            rest,
            all: OnceLock::new(),
        }
    }

    /// Every parameter name, in order.
    pub fn names(&'static self) -> &'static [&'static str] {
        self.all.get_or_init(|| {
            let shared = SHARED.iter().map(|(name, _)| *name);
            let own = self.first.iter().copied();
            own.chain(shared).chain(self.rest.iter().copied()).collect()
        })
    }

    /// `query` parsed for `backend` ([`Params::parse`] over [`names`](Self::names)).
    pub fn parse(
        &'static self,
        query: Option<&str>,
        backend: &'static str,
    ) -> Result<Params, UrlError> {
        Params::parse(query, backend, self.names())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static PARAMS: UrlParams = UrlParams::new(&["schema"], &["sslmode"]);

    #[test]
    fn the_shared_names_stand_between_the_backends_own() {
        assert_eq!(
            PARAMS.names(),
            [
                "schema",
                "table",
                "pool_size",
                "acquire_timeout",
                "clock",
                "connect_timeout",
                "migrate",
                "sslmode"
            ]
        );
    }

    #[test]
    fn every_shared_parameter_sets_its_setting() {
        let query = "table=t&pool_size=3&acquire_timeout=2s&clock=local\
                     &connect_timeout=750ms&migrate=false&schema=s";
        let mut params = PARAMS.parse(Some(query), "test").unwrap();
        let s = SqlSettings::from_params(&mut params).unwrap();
        assert_eq!(s.table, "t");
        assert_eq!(s.max_connections, 3);
        assert_eq!(s.acquire_timeout, std::time::Duration::from_secs(2));
        assert!(s.clock.is_some(), "clock=local injects the system clock");
        assert_eq!(s.connect_timeout, std::time::Duration::from_millis(750));
        assert!(!s.migrate);
        assert_eq!(
            params.take("schema").as_deref(),
            Some("s"),
            "left for the backend"
        );
        assert!(matches!(
            PARAMS.parse(Some("pool=3"), "test"),
            Err(UrlError::UnknownParameter { .. })
        ));
    }
}
