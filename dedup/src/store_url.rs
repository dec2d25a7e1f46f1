//! [`StoreUrl`]: a store URL dispatched, by its scheme, to the backend whose descriptor
//! answers it ([`crate::url::backends`]); the backend's crate parses the rest.

use std::fmt;
use std::sync::Arc;

use dedup_core::Clock;
use dedup_core::backend::url::{
    BackendDescriptor, StoreTarget, UrlError, UrlParts, malformed, redact,
};

use crate::error::OpenError;
use crate::registry::{Entry, lines};

/// A store URL, parsed and checked.
///
/// It holds which backend, and the configuration the store will be opened with. Parsing
/// contacts nothing and writes nothing; [`open`](Self::open) does. Its `Debug` and
/// `Display` show the URL with passwords masked.
///
/// # Examples
///
/// ```
/// let url = dedup::StoreUrl::parse("memory:").unwrap();
/// assert_eq!(url.backend(), "memory");
/// let bad = dedup::StoreUrl::parse("sqlite:inbox.db?tabel=x").unwrap_err();
/// assert!(bad.to_string().contains("invalid store URL"));
/// ```
#[derive(Clone)]
pub struct StoreUrl {
    shown: String,
    target: StoreTarget,
}

impl StoreUrl {
    /// Parses and checks `url`. See the [crate docs](crate) for the forms and their
    /// parameters.
    ///
    /// # Errors
    ///
    /// [`OpenError::Url`]: an unknown scheme or parameter, a parameter given twice, a
    /// value that cannot be used, or a backend this build lacks
    /// ([`UrlError::Disabled`]).
    pub fn parse(url: &str) -> Result<Self, OpenError> {
        let shown = redact(url);
        match target(&lines(), url) {
            Ok(target) => Ok(StoreUrl { shown, target }),
            Err(problem) => Err(OpenError::Url {
                url: shown,
                problem,
            }),
        }
    }

    /// [`parse`](Self::parse) `url` with some of its parameters replaced (or added): each
    /// `(name, value)` in `overrides` takes the place of the URL's own `name=` parameter, and
    /// is checked exactly like one written in the URL (a parameter the backend does not take
    /// is [`UrlError::UnknownParameter`]). For tools whose flags override a URL, such as the
    /// `dedup` command line's `--table`, `--schema` and `--prefix`.
    pub fn parse_with(url: &str, overrides: &[(&str, &str)]) -> Result<Self, OpenError> {
        if overrides.is_empty() {
            return Self::parse(url);
        }
        let (base, query) = match url.split_once('?') {
            Some((base, query)) => (base, query),
            None => (url, ""),
        };
        let mut out = form_urlencoded::Serializer::new(String::new());
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            if !overrides.iter().any(|(o, _)| *o == name) {
                out.append_pair(&name, &value);
            }
        }
        for (name, value) in overrides {
            out.append_pair(name, value);
        }
        Self::parse(&format!("{base}?{}", out.finish()))
    }

    /// Where this store keeps its records, for people: `FILE, table T` (SQLite), `table
    /// SCHEMA.T` (PostgreSQL), `key prefix P` (Redis)... as its backend words it.
    pub fn location(&self) -> String {
        self.target.as_target().location()
    }

    /// The database file, for stores kept in one (SQLite); `None` otherwise.
    pub fn file(&self) -> Option<&std::path::Path> {
        self.target.as_target().file()
    }

    /// The backend's name: `memory`, `sqlite`, `postgres`, `mysql`, `redis` or
    /// `redis-cluster`.
    pub fn backend(&self) -> &'static str {
        self.target.as_target().backend()
    }

    /// The descriptor of the backend this URL names: its schemes, whether it has a schema
    /// to migrate, an outbox.
    pub fn descriptor(&self) -> &'static BackendDescriptor {
        self.target.descriptor()
    }

    /// The backend and configuration this URL opens.
    pub fn target(&self) -> &StoreTarget {
        &self.target
    }

    /// The backend and configuration, to adjust before opening them yourself (downcast
    /// it to the backend's target type, `dedup::postgres::PostgresTarget`...).
    pub fn into_target(self) -> StoreTarget {
        self.target
    }

    /// Use `clock` for lease arithmetic instead of the URL's (`clock=`) or the backend's
    /// default (simulations and tests control expiry this way).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.target.as_target_mut().set_clock(clock);
        self
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreUrl")
            .field("url", &self.shown)
            .field("backend", &self.backend())
            .finish_non_exhaustive()
    }
}

/// The scheme's line in `registry`, then its backend's parser.
fn target(registry: &[Entry], url: &str) -> Result<StoreTarget, UrlError> {
    let forms = || -> Vec<&'static str> {
        registry
            .iter()
            .flat_map(|e| e.forms.iter().copied())
            .collect()
    };
    let Some(parts) = UrlParts::split(url) else {
        return Err(malformed(format!(
            "no scheme: start with one of {}",
            forms().join(", ")
        )));
    };
    let Some(line) = registry.iter().find(|e| {
        e.schemes
            .iter()
            .any(|s| s.eq_ignore_ascii_case(parts.scheme))
    }) else {
        return Err(UrlError::UnknownScheme {
            scheme: parts.scheme.to_owned(),
            known: forms(),
        });
    };
    match line.descriptor {
        Some(descriptor) => (descriptor.parse)(&parts),
        None => Err(UrlError::Disabled {
            what: line.what,
            feature: line.feature,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry whose second line is a backend built without its feature: its URLs are
    /// refused, before any parsing, with the feature to enable; the others still parse.
    #[test]
    fn a_disabled_backend_is_refused_with_its_feature() {
        let registry = [
            Entry {
                what: "memory backend",
                feature: "",
                schemes: &["memory"],
                forms: &["memory:"],
                descriptor: Some(&dedup_core::backend::url::MEMORY),
            },
            Entry {
                what: "postgres backend",
                feature: "postgres",
                schemes: &["postgres", "postgresql"],
                forms: &["postgres://USER:PASSWORD@HOST/DB"],
                descriptor: None,
            },
        ];
        for url in ["postgres://h/db?tabel=x", "POSTGRESQL://h/db"] {
            let problem = target(&registry, url).unwrap_err();
            assert!(
                matches!(
                    problem,
                    UrlError::Disabled {
                        what: "postgres backend",
                        feature: "postgres"
                    }
                ),
                "{url}: {problem:?}"
            );
            assert!(
                problem
                    .to_string()
                    .contains("enable the `postgres` cargo feature"),
                "{problem}"
            );
        }
        assert!(target(&registry, "memory:").is_ok());
        let unknown = target(&registry, "redis://h:1").unwrap_err();
        assert!(
            unknown
                .to_string()
                .contains("memory:, postgres://USER:PASSWORD@HOST/DB"),
            "{unknown}"
        );
    }
}
