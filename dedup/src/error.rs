//! [`OpenError`] and [`UrlError`]: why [`open`](crate::open) failed.

/// Why [`open`](crate::open) or [`StoreUrl::parse`](crate::StoreUrl::parse) failed.
///
/// Messages show the URL with its passwords masked ([`redact`](crate::redact)). Converts
/// into [`dedup_core::Error`] (a URL problem becomes [`Error::InvalidInput`](
/// dedup_core::Error::InvalidInput)) for code that handles one error type.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The URL was rejected before anything was contacted or written.
    #[error("invalid store URL {url}")]
    Url {
        /// The URL, passwords masked.
        url: String,
        /// What is wrong with it.
        #[source]
        problem: UrlError,
    },
    /// The backend failed to open the store (connect, authenticate, create the schema...).
    #[error("cannot open the store {url}")]
    Store {
        /// The URL, passwords masked.
        url: String,
        /// The backend's error (its `source` chain holds the driver's and OS's causes).
        #[source]
        source: dedup_core::Error,
    },
}

impl OpenError {
    /// The URL problem, when the URL was rejected.
    pub fn url_problem(&self) -> Option<&UrlError> {
        match self {
            OpenError::Url { problem, .. } => Some(problem),
            OpenError::Store { .. } => None,
        }
    }

    /// The backend's error, when opening failed after the URL was accepted.
    pub fn store_error(&self) -> Option<&dedup_core::Error> {
        match self {
            OpenError::Store { source, .. } => Some(source),
            OpenError::Url { .. } => None,
        }
    }

    /// Whether trying again can succeed (a server not reachable yet, for example).
    pub fn is_retryable(&self) -> bool {
        self.store_error()
            .is_some_and(dedup_core::Error::is_retryable)
    }
}

impl From<OpenError> for dedup_core::Error {
    fn from(e: OpenError) -> Self {
        match e {
            OpenError::Url { url, problem } => {
                dedup_core::Error::invalid("store url", format!("{url}: {problem}"))
            }
            OpenError::Store { source, .. } => source,
        }
    }
}

/// What is wrong with a store URL.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// The scheme names no store.
    #[error(
        "unknown scheme {scheme:?}: use memory:, sqlite:PATH, postgres://, mysql://, mariadb://, redis://, rediss://, \
         redis+cluster:// or rediss+cluster://"
    )]
    UnknownScheme {
        /// The scheme as written.
        scheme: String,
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
    /// The URL names a store without an outbox ([`open_outbox`](crate::open_outbox)).
    #[error("the outbox needs a SQL store (sqlite:PATH or postgres://); {backend} has no outbox")]
    NoOutbox {
        /// The backend the URL names.
        backend: &'static str,
    },
    /// The backend's configuration built from the URL is invalid (an unsafe table name, a
    /// zero timeout...).
    #[error(transparent)]
    Config(dedup_core::Error),
}
