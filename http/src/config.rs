//! What the layer guards and how: [`IdempotencyConfig`] and its parts.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dedup_core::{InboxConfig, MAX_OUTCOME_LEN};
use http::{HeaderName, Method, StatusCode, request::Parts};

/// How the layer behaves. Build it with struct update syntax:
///
/// ```
/// use dedup_http::IdempotencyConfig;
/// let config = IdempotencyConfig {
///     max_request_body: 64 * 1024,
///     ..IdempotencyConfig::default()
/// };
/// assert_eq!(config.header, "idempotency-key");
/// ```
#[derive(Clone, Debug)]
pub struct IdempotencyConfig {
    /// The request header carrying the key. Default `Idempotency-Key`.
    pub header: HeaderName,
    /// The header added to replayed responses, with the value `true`. Default
    /// `Idempotency-Replayed`.
    pub replayed_header: HeaderName,
    /// The methods guarded; requests with any other method pass through untouched (their
    /// bodies are not buffered). Default `POST` and `PATCH`.
    pub methods: Vec<Method>,
    /// Whether a guarded request without the key header is refused with `400` (default).
    /// When false, such requests pass through unguarded.
    pub require_key: bool,
    /// What a key is scoped by (besides the [`Principal`], always included when present).
    pub scope: Scope,
    /// What the payload fingerprint covers.
    pub fingerprint: FingerprintConfig,
    /// The largest request body buffered, in bytes; a larger body is answered with `413`
    /// before anything is claimed. Default 1 MiB.
    pub max_request_body: usize,
    /// The largest response body stored for replay, in bytes. Default 60 KiB, which keeps a
    /// stored response (with its headers) under the store's 64 KiB outcome limit. A larger
    /// body still reaches the first caller; see the crate docs for what a replay gets.
    pub max_stored_body: usize,
    /// The response headers stored with the status and body and replayed (others are not
    /// stored). Default: `content-type`, `content-language`, `content-location`,
    /// `location`, `etag`, `last-modified`, `cache-control`.
    pub stored_headers: Vec<HeaderName>,
    /// Which responses of the inner service release the key instead of being stored.
    pub release: ReleasePolicy,
    /// The lease each claim takes and how often it is renewed while the handler runs.
    /// Default: 30 s, renewed every 10 s.
    pub lease: InboxConfig,
    /// The `Retry-After` sent with `409` while the first request is still in flight.
    /// Default 1 s (rounded up to whole seconds, at least 1).
    pub retry_after: Duration,
    /// Prefix of the problem `type` URIs (`{prefix}idempotency-key-missing`, ...). Default
    /// `urn:dedup-http:`; point it at your API's documentation if you have a page for them.
    pub problem_type_prefix: String,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        IdempotencyConfig {
            header: HeaderName::from_static("idempotency-key"),
            replayed_header: HeaderName::from_static("idempotency-replayed"),
            methods: vec![Method::POST, Method::PATCH],
            require_key: true,
            scope: Scope::MethodAndRoute,
            fingerprint: FingerprintConfig::default(),
            max_request_body: 1024 * 1024,
            max_stored_body: MAX_OUTCOME_LEN - 4 * 1024,
            stored_headers: [
                http::header::CONTENT_TYPE,
                http::header::CONTENT_LANGUAGE,
                http::header::CONTENT_LOCATION,
                http::header::LOCATION,
                http::header::ETAG,
                http::header::LAST_MODIFIED,
                http::header::CACHE_CONTROL,
            ]
            .into(),
            release: ReleasePolicy::ServerErrors,
            lease: InboxConfig::default(),
            retry_after: Duration::from_secs(1),
            problem_type_prefix: "urn:dedup-http:".into(),
        }
    }
}

/// The authenticated caller, put into the request's extensions by the application's own
/// authentication layer (which must run before this one). When present it is part of
/// every key's scope, so two callers' keys never collide.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Principal(pub String);

/// A scope function: the part of the key that names the operation.
pub type ScopeFn = Arc<dyn Fn(&Parts) -> String + Send + Sync>;

/// What a key is scoped by. The key stored is `(consumer, message id)` with the header
/// value as message id and `http:` + the scope as consumer: `http:POST /orders`, or
/// `http:p5:alice:POST /orders` with the principal `alice` (its length first, so no
/// principal can imitate another scope). A consumer longer than a key allows is replaced by
/// `http:sha256:` and its hash.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum Scope {
    /// The method and the route: axum's matched route template (`/orders/{id}`) when the
    /// `axum` feature is on and the layer runs inside a router, the request path otherwise.
    /// The same key sent to two routes is two operations. The default.
    #[default]
    MethodAndRoute,
    /// One namespace for the whole service (as Stripe scopes keys per account): a key sent
    /// to another route is then a different payload, answered with `422`.
    Service,
    /// A function of the request head.
    Custom(ScopeFn),
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::MethodAndRoute => f.write_str("MethodAndRoute"),
            Scope::Service => f.write_str("Service"),
            Scope::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// What the payload fingerprint covers: always the method, the path, the query (minus
/// [`ignore_query`](Self::ignore_query)) and the body (minus
/// [`ignore_json`](Self::ignore_json)); plus the listed [`headers`](Self::headers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FingerprintConfig {
    /// Request headers whose values join the fingerprint (none by default: most headers,
    /// such as tracing ids, legitimately change between retries).
    pub headers: Vec<HeaderName>,
    /// Query parameters left out (by name).
    pub ignore_query: Vec<String>,
    /// JSON fields left out, as JSON pointers (`/client_ts`, `/meta/trace_id`). When
    /// non-empty and the body parses as JSON, the fingerprint covers the remaining document
    /// in a canonical form (object keys sorted, no whitespace), so re-serialised retries
    /// match; other bodies are covered byte for byte.
    pub ignore_json: Vec<String>,
}

/// Which responses of the inner service release the key (the next retry runs the handler
/// again) rather than being stored and replayed. An inner service error (`Err`) and a
/// dropped request future always release.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleasePolicy {
    /// `5xx` releases; everything else (`4xx` included) is stored. The default.
    #[default]
    ServerErrors,
    /// `4xx` and `5xx` release; only `1xx`-`3xx` are stored.
    AllErrors,
    /// Every response is stored, `5xx` included.
    Never,
}

impl ReleasePolicy {
    /// Whether a response with `status` releases the key.
    pub fn releases(self, status: StatusCode) -> bool {
        match self {
            ReleasePolicy::ServerErrors => status.is_server_error(),
            ReleasePolicy::AllErrors => status.is_client_error() || status.is_server_error(),
            ReleasePolicy::Never => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_names_its_kind_in_debug() {
        let custom = Scope::Custom(Arc::new(|_| "x".to_string()));
        let shown = [Scope::MethodAndRoute, Scope::Service, custom].map(|s| format!("{s:?}"));
        assert_eq!(shown, ["MethodAndRoute", "Service", "Custom(..)"]);
    }
}
