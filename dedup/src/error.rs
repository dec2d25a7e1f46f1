//! [`OpenError`]: why [`open`](crate::open) failed.

use dedup_core::backend::url::UrlError;

/// Why [`open`](crate::open) or [`StoreUrl::parse`](crate::StoreUrl::parse) failed.
///
/// Messages show the URL with its passwords masked ([`redact`](crate::url::redact)). Converts
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

/// Why [`register`](crate::register) refused a store. Nothing was registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// Another backend already answers the scheme.
    #[error("cannot register the {scheme:?} scheme: the {by} backend answers it")]
    SchemeTaken {
        /// The scheme, as the refused descriptor has it.
        scheme: &'static str,
        /// The backend that answers it (`"postgres"`, or a registered store's name).
        by: &'static str,
    },
    /// The descriptor has no scheme, or one that is not a lower-case URL scheme.
    #[error(
        "cannot register the {backend} backend: {scheme:?} is not a lower-case URL scheme \
         (a letter, then letters, digits, `+`, `-` or `.`)"
    )]
    InvalidScheme {
        /// The descriptor's name.
        backend: &'static str,
        /// The scheme refused (empty when the descriptor has none).
        scheme: &'static str,
    },
}
