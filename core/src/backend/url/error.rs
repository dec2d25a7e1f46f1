//! [`UrlError`]: what is wrong with a store URL.

/// What is wrong with a store URL. Every one is found before anything is contacted or
/// written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// The scheme names no store.
    #[error("unknown scheme {scheme:?}: use {}", known.join(", "))]
    UnknownScheme {
        /// The scheme as written.
        scheme: String,
        /// The URL forms that name a store (every backend's, enabled or not).
        known: Vec<&'static str>,
    },
    /// The URL's shape is wrong (no path, no host, no cluster node...).
    #[error("{reason}")]
    Malformed {
        /// What is wrong, in words.
        reason: String,
    },
    /// A query parameter this backend does not know.
    #[error("unknown parameter {name:?} for {backend} (known: {})", known.join(", "))]
    UnknownParameter {
        /// The parameter as written.
        name: String,
        /// The backend the URL names.
        backend: &'static str,
        /// The parameters it accepts.
        known: &'static [&'static str],
    },
    /// A query parameter with a value that cannot be used.
    #[error("parameter {name}={value:?}: {reason}")]
    InvalidParameter {
        /// The parameter.
        name: String,
        /// Its value as written.
        value: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// The URL names a backend (or TLS) this build does not include.
    #[error("this build has no {what}: enable the `{feature}` cargo feature of `dedup`")]
    Disabled {
        /// What is missing (`"postgres backend"`, `"TLS"`...).
        what: &'static str,
        /// The cargo feature that brings it.
        feature: &'static str,
    },
    /// The URL names a store without an outbox (`dedup::open_outbox`).
    #[error("the outbox needs a SQL store with an outbox table; {backend} has no outbox")]
    NoOutbox {
        /// The backend the URL names.
        backend: &'static str,
    },
    /// The backend's configuration built from the URL is invalid (an unsafe table name, a
    /// zero timeout...).
    #[error(transparent)]
    Config(crate::Error),
}

/// [`UrlError::Malformed`], saying `reason`.
pub fn malformed(reason: impl Into<String>) -> UrlError {
    UrlError::Malformed {
        reason: reason.into(),
    }
}

/// [`UrlError::Disabled`] for TLS when `wanted` and the backend was built without its
/// `tls` feature (`enabled`: `cfg!(feature = "tls")` in the backend's crate).
pub fn tls_available(wanted: bool, enabled: bool) -> Result<(), UrlError> {
    if wanted && !enabled {
        return Err(UrlError::Disabled {
            what: "TLS",
            feature: "tls",
        });
    }
    Ok(())
}
