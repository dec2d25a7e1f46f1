//! Store URLs, for authors of backends: each backend crate parses its own URLs and exports
//! one [`BackendDescriptor`]; the `dedup` facade keeps a registry of them (one line per
//! enabled backend) and dispatches on the scheme. What every backend's grammar shares lives
//! here once: [`Params`] (read each parameter once, refuse unknown ones), the value
//! grammars ([`duration`], [`count`], [`boolean`], [`on_off`], the `clock=` parameter),
//! [`redact`], and [`UrlError`].
//!
//! Parsing contacts nothing and writes nothing: a backend's `parse` checks the whole URL
//! and its configuration, and returns a [`StoreTarget`] that opens the store later.

mod error;
mod memory;
mod params;
mod redact;
mod target;

pub use error::{UrlError, malformed, tls_available};
pub use memory::{MEMORY, MemoryTarget};
pub use params::{Params, boolean, count, duration, invalid, on_off};
pub use redact::redact;
pub use target::{OpenTarget, StoreTarget};

/// A store URL split at its scheme: `scheme:rest?query`.
#[derive(Clone, Copy, Debug)]
pub struct UrlParts<'a> {
    /// The scheme as written (compare it case-insensitively).
    pub scheme: &'a str,
    /// What follows `scheme:`, up to the query (`//host/db`, a file path...).
    pub rest: &'a str,
    /// The query, without its `?`.
    pub query: Option<&'a str>,
}

impl<'a> UrlParts<'a> {
    /// Split `url`; a URL without `:` has no scheme.
    pub fn split(url: &'a str) -> Option<Self> {
        let (scheme, rest) = url.split_once(':')?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        Some(UrlParts {
            scheme,
            rest,
            query,
        })
    }

    /// `scheme://rest` for a server: checks that it starts with `//` and parses as a URL
    /// with a host (the driver parses it again); `what` names the server in the error
    /// (`"PostgreSQL"`). `scheme` replaces the URL's own (`mariadb://` is given to the
    /// driver as `mysql://`).
    #[cfg(feature = "server-url")]
    #[cfg_attr(docsrs, doc(cfg(feature = "server-url")))]
    pub fn server_url(&self, scheme: &str, what: &str) -> Result<String, UrlError> {
        server_url(scheme, self.rest, what)
    }
}

/// `scheme:rest` checked as a server URL (see [`UrlParts::server_url`]).
#[cfg(feature = "server-url")]
#[cfg_attr(docsrs, doc(cfg(feature = "server-url")))]
pub fn server_url(scheme: &str, rest: &str, what: &str) -> Result<String, UrlError> {
    if !rest.starts_with("//") {
        return Err(malformed(format!("{what} URLs start with {scheme}://")));
    }
    let base = format!("{scheme}:{rest}");
    url::Url::parse(&base).map_err(|e| malformed(format!("not a valid {what} URL: {e}")))?;
    Ok(base)
}

/// `base` with the query `query` appended (the driver's own parameters).
pub fn with_query(base: String, query: Option<String>) -> String {
    match query {
        Some(q) => format!("{base}?{q}"),
        None => base,
    }
}

/// One backend's part in store URLs and the tools built on them: the schemes it answers,
/// its parser, and what the operator's tools need to know about it without naming it.
/// Each backend crate exports one as `DESCRIPTOR`; the `dedup` facade's registry lists
/// them.
#[derive(Debug)]
pub struct BackendDescriptor {
    /// The backend's name (`"postgres"`), as in [`UrlError::UnknownParameter`].
    pub name: &'static str,
    /// The schemes it answers, in lower case (`postgres`, `postgresql`).
    pub schemes: &'static [&'static str],
    /// Its URL forms for people (`postgres://USER@HOST/DB`), for help texts and errors.
    pub forms: &'static [&'static str],
    /// Parse a URL with one of [`schemes`](Self::schemes): the whole URL and the
    /// configuration it gives are checked, nothing is contacted.
    pub parse: fn(&UrlParts<'_>) -> Result<StoreTarget, UrlError>,
    /// Whether the store has a schema to create and migrate (tables), so that read-only
    /// tools open it with `migrate=false` (a parameter it then takes).
    pub has_schema: bool,
    /// Whether the store has an outbox ([`OpenTarget::open_outbox`]).
    pub has_outbox: bool,
}

impl BackendDescriptor {
    /// Whether `scheme` (any case) is one of this backend's.
    pub fn answers(&self, scheme: &str) -> bool {
        self.schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme))
    }
}
