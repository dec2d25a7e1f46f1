//! [`IdempotencyLayer`] and the service it wraps around yours, [`Idempotency`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use dedup_core::{DedupStore, Error, Handled, Inbox, InboxError, Lease};
use http::{HeaderValue, Request, Response, header, request::Parts};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full, LengthLimitError, Limited};
use tower_layer::Layer;
use tower_service::Service;

use crate::identity::{request_fingerprint, request_key};
use crate::key_header::parse_key;
use crate::{IdempotencyConfig, Problem, StoredResponse};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A tower [`Layer`] that makes the wrapped service idempotent per `Idempotency-Key`.
///
/// It works over any [`DedupStore`]. A client that retries a request with the same key
/// gets the first response back. The handler does not run twice. See the [crate
/// docs](crate) for the protocol. Clones share the store and the configuration.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use axum::{Router, body::Body, routing::post};
/// use dedup_core::{DedupStore, MemoryStore};
/// use dedup_http::IdempotencyLayer;
/// use http::Request;
/// use tower_service::Service;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store: Arc<dyn DedupStore> = Arc::new(MemoryStore::new());
/// let mut app: Router = Router::new()
///     .route("/orders", post(|| async { "created" }))
///     .layer(IdempotencyLayer::new(store));
///
/// let order = || Request::post("/orders").header("Idempotency-Key", "k-42").body(Body::empty());
/// let first = app.call(order()?).await?;
/// assert_eq!(first.status(), 200);
///
/// // The client retries: it gets the stored response back.
/// let retry = app.call(order()?).await?;
/// assert_eq!(retry.status(), 200);
/// assert_eq!(retry.headers()["idempotency-replayed"], "true");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct IdempotencyLayer {
    shared: Arc<Shared>,
}

struct Shared {
    config: IdempotencyConfig,
    inbox: Inbox<dyn DedupStore>,
}

impl IdempotencyLayer {
    /// A layer over `store` with the default [`IdempotencyConfig`].
    pub fn new(store: Arc<dyn DedupStore>) -> Self {
        Self::with_config(store, IdempotencyConfig::default())
    }

    /// A layer over `store` with `config`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use dedup_core::{DedupStore, MemoryStore};
    /// use dedup_http::{IdempotencyConfig, IdempotencyLayer};
    ///
    /// let store: Arc<dyn DedupStore> = Arc::new(MemoryStore::new());
    /// let mut config = IdempotencyConfig::default();
    /// config.lease.lease = Duration::from_secs(60); // handlers that run long
    /// let layer = IdempotencyLayer::with_config(store, config);
    /// assert_eq!(layer.config().lease.lease, Duration::from_secs(60));
    /// ```
    pub fn with_config(store: Arc<dyn DedupStore>, config: IdempotencyConfig) -> Self {
        let inbox = Inbox::from_arc(store, config.lease.clone());
        IdempotencyLayer {
            shared: Arc::new(Shared { config, inbox }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &IdempotencyConfig {
        &self.shared.config
    }
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service [`IdempotencyLayer`] produces around `S`.
///
/// The inner service sees guarded requests with their buffered body
/// (`Either::Left(Full<Bytes>)`). The running claim's [`Lease`] is in the request
/// extensions. Its `fence` and `idempotency_key()` are stable handles for calls to other
/// systems. Other requests pass through with their own body (`Either::Right`).
///
/// # Errors
///
/// The layer answers its own refusals and store failures as responses
/// (`application/problem+json`), never as errors. An `Err` from the inner service passes
/// through, after the key was released.
///
/// # Cancel safety
///
/// Dropping the response future (the client went away, a shutdown) releases the key in
/// the background. A retry then runs the handler afresh.
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The request body the inner service receives.
pub type InnerBody<B> = Either<Full<Bytes>, B>;

/// The response body the layer returns: buffered for guarded requests, the inner body
/// otherwise.
pub type OuterBody<B> = Either<Full<Bytes>, B>;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, B, ResBody> Service<Request<B>> for Idempotency<S>
where
    S: Service<Request<InnerBody<B>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<OuterBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The instance polled ready serves this request; the clone serves the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            if !shared.config.methods.contains(request.method()) {
                return pass_through(inner, request).await;
            }
            let key = match shared.key_header(&request) {
                Ok(Some(key)) => key,
                Ok(None) => return pass_through(inner, request).await,
                Err((problem, detail)) => return Ok(shared.problem(problem, &detail).map(full)),
            };
            Ok(shared.guarded(inner, request, key).await?.map(full))
        })
    }
}

/// What the guarded handler returns to the Inbox when it has no response to store (the
/// [`Failure`] itself stays with the caller).
#[derive(Debug, thiserror::Error)]
#[error("the request produced no response to store")]
struct NotStored;

/// Why the guarded handler did not produce a response to store.
enum Failure<E> {
    /// The response's status releases the key; it goes to the caller as it is.
    Released(Response<Bytes>),
    /// The inner service failed.
    Inner(E),
    /// The inner response's body failed while read (the error stays on the server side).
    Body,
}

impl Shared {
    /// The key the request carries: `Ok(None)` when it carries none and none is required,
    /// `Err` with the `400` problem when it is missing or invalid.
    fn key_header<B>(&self, request: &Request<B>) -> Result<Option<String>, (Problem, String)> {
        let config = &self.config;
        let mut values = request.headers().get_all(&config.header).iter();
        match (values.next(), values.next()) {
            (None, _) if !config.require_key => Ok(None),
            (None, _) => {
                let detail = format!(
                    "{} requests to this resource need an {} header",
                    request.method(),
                    config.header
                );
                Err((Problem::KeyMissing, detail))
            }
            (Some(_), Some(_)) => {
                let detail = format!("send exactly one {} header", config.header);
                Err((Problem::KeyInvalid, detail))
            }
            (Some(value), None) => match parse_key(value) {
                Ok(key) => Ok(Some(key)),
                Err(e) => Err((Problem::KeyInvalid, e.to_string())),
            },
        }
    }

    /// Buffer, claim, run, store, or answer from the stored record.
    async fn guarded<S, B, ResBody>(
        &self,
        inner: S,
        request: Request<B>,
        key: String,
    ) -> Result<Response<Bytes>, S::Error>
    where
        S: Service<Request<InnerBody<B>>, Response = Response<ResBody>>,
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
        ResBody: Body<Data = Bytes>,
        ResBody::Error: Into<BoxError>,
    {
        let config = &self.config;
        let too_large = || {
            let detail = format!("the body is larger than {} bytes", config.max_request_body);
            self.problem(Problem::BodyTooLarge, &detail)
        };
        let declared = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|len| len > config.max_request_body as u64) {
            return Ok(too_large());
        }
        let (parts, body) = request.into_parts();
        let body = match Limited::new(body, config.max_request_body).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<LengthLimitError>() => return Ok(too_large()),
            Err(_) => {
                return Ok(self.problem(Problem::BodyUnreadable, "the request body stream failed"));
            }
        };
        let fingerprint = request_fingerprint(&config.fingerprint, &parts, &body);
        let key = match request_key(config, &parts, key) {
            Ok(key) => key,
            Err(e) => return Ok(self.problem(Problem::KeyInvalid, &e.to_string())),
        };

        // The Inbox boxes handler errors; the typed failure (which may hold a response or
        // the inner service's own error) is kept here instead.
        let (mut produced, mut failure) = (None, None);
        // The request is consumed by its one run: the handler's error (`NotStored`) is never
        // `Transient`, so the inbox's `handler_retry` never calls it a second time, and a
        // second call would find nothing to run and fail as a run without a response.
        let mut request = Some((inner, parts, body, &mut produced, &mut failure));
        let handled = self
            .inbox
            .handle(&key, Some(fingerprint), move |lease| {
                let request = request.take();
                async move {
                    let (inner, parts, body, slot, failed) = request.ok_or(NotStored)?;
                    let result = self.run_guarded(inner, parts, body, lease, slot).await;
                    result.map_err(|f| {
                        *failed = Some(f);
                        NotStored
                    })
                }
            })
            .await;
        let response = match handled {
            Ok(Handled::Processed { .. }) => match produced {
                Some(response) => response,
                None => self.problem(Problem::ResponseBodyFailed, "no response was produced"),
            },
            Ok(Handled::Duplicate { outcome, .. }) => self.replay(outcome.as_deref()),
            Ok(Handled::Busy { .. }) => {
                let detail = "the first request with this key has not finished; retry later";
                self.with_retry_after(self.problem(Problem::InFlight, detail))
            }
            // Only with an attempt limit or stored failures configured in `lease`.
            Ok(Handled::DeadLetter { attempts, .. }) => {
                let detail = format!("the key used up its {attempts} attempts");
                self.problem(Problem::StoredResponseUnreadable, &detail)
            }
            Ok(Handled::Failed { error, .. }) => {
                let detail = format!("a failure was stored for this key: {error}");
                self.problem(Problem::StoredResponseUnreadable, &detail)
            }
            Err(InboxError::Handler { .. }) => match failure {
                Some(Failure::Released(response)) => response,
                Some(Failure::Inner(e)) => return Err(e),
                Some(Failure::Body) | None => {
                    let detail = "the response body failed while read; the key was released";
                    self.problem(Problem::ResponseBodyFailed, detail)
                }
            },
            Err(InboxError::Store(Error::FingerprintMismatch { .. })) => {
                let detail = "this key was first used with another method, path, query or body";
                self.problem(Problem::KeyReused, detail)
            }
            // The handler ran but its commit failed or its lease was taken over: the caller
            // gets what it produced (a retry after the lease expires runs it again).
            Err(InboxError::Store(_) | InboxError::LeaseLost { .. }) if produced.is_some() => {
                produced.expect("checked")
            }
            Err(_) => {
                let detail = "the idempotency store is unavailable; retry later";
                self.with_retry_after(self.problem(Problem::StoreUnavailable, detail))
            }
        };
        Ok(response)
    }

    /// Run the inner service for a claimed request and turn its response into the outcome
    /// to store (or a failure that releases the key).
    async fn run_guarded<S, B, ResBody>(
        &self,
        mut inner: S,
        parts: Parts,
        body: Bytes,
        lease: Lease,
        produced: &mut Option<Response<Bytes>>,
    ) -> Result<Option<Vec<u8>>, Failure<S::Error>>
    where
        S: Service<Request<InnerBody<B>>, Response = Response<ResBody>>,
        ResBody: Body<Data = Bytes>,
        ResBody::Error: Into<BoxError>,
    {
        let mut request = Request::from_parts(parts, Either::Left(Full::new(body)));
        request.extensions_mut().insert(lease);
        futures::future::poll_fn(|cx| inner.poll_ready(cx))
            .await
            .map_err(Failure::Inner)?;
        let response = inner.call(request).await.map_err(Failure::Inner)?;
        let (head, body) = response.into_parts();
        let body = body.collect().await.map_err(|_| Failure::Body)?;
        let response = Response::from_parts(head, body.to_bytes());
        if self.config.release.releases(response.status()) {
            return Err(Failure::Released(response));
        }
        let outcome = self.stored(&response).encode();
        *produced = Some(response);
        Ok(Some(outcome))
    }

    /// What is kept of `response`: status, the chosen headers, the body within the limits.
    fn stored(&self, response: &Response<Bytes>) -> StoredResponse {
        let mut headers = http::HeaderMap::new();
        for name in &self.config.stored_headers {
            for value in response.headers().get_all(name) {
                headers.append(name.clone(), value.clone());
            }
        }
        let body = response.body().clone();
        let mut stored = StoredResponse {
            status: response.status(),
            headers,
            body: (body.len() <= self.config.max_stored_body).then_some(body),
        };
        if stored.body.is_some() && stored.encode().len() > dedup_core::MAX_OUTCOME_LEN {
            stored.body = None;
        }
        if stored.encode().len() > dedup_core::MAX_OUTCOME_LEN {
            stored.headers.clear();
        }
        stored
    }

    /// The answer to a retry of a completed key.
    fn replay(&self, outcome: Option<&[u8]>) -> Response<Bytes> {
        let stored = match outcome.map(StoredResponse::decode) {
            Some(Ok(stored)) => stored,
            Some(Err(e)) => return self.problem(Problem::StoredResponseUnreadable, &e.to_string()),
            None => {
                let detail = "the key is completed without a stored response";
                return self.problem(Problem::StoredResponseUnreadable, detail);
            }
        };
        let mut response = match stored.body {
            Some(body) => {
                let mut response = Response::new(body);
                *response.status_mut() = stored.status;
                *response.headers_mut() = stored.headers;
                response
            }
            None => {
                let detail = format!(
                    "the request with this key was processed (status {}), but its response \
                     body was too large to store for replay",
                    stored.status.as_u16()
                );
                Problem::ResponseNotStored.response(
                    &self.config.problem_type_prefix,
                    stored.status,
                    &detail,
                )
            }
        };
        response.headers_mut().insert(
            self.config.replayed_header.clone(),
            HeaderValue::from_static("true"),
        );
        response
    }

    fn problem(&self, problem: Problem, detail: &str) -> Response<Bytes> {
        problem.response(&self.config.problem_type_prefix, problem.status(), detail)
    }

    fn with_retry_after(&self, mut response: Response<Bytes>) -> Response<Bytes> {
        let secs = self.config.retry_after.as_secs_f64().ceil().max(1.0) as u64;
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        response
    }
}

fn full<B>(body: Bytes) -> OuterBody<B> {
    Either::Left(Full::new(body))
}

async fn pass_through<S, B, ResBody>(
    mut inner: S,
    request: Request<B>,
) -> Result<Response<OuterBody<ResBody>>, S::Error>
where
    S: Service<Request<InnerBody<B>>, Response = Response<ResBody>>,
{
    futures::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
    let response = inner.call(request.map(Either::Right)).await?;
    Ok(response.map(Either::Right))
}
