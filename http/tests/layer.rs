//! The layer's configuration choices, through the tower `Service` interface (no socket: the
//! protocol over real servers and backends is in `tests/http.rs`). The store is
//! `MemoryStore`, the reference model every backend is proven against.

use std::future::Ready;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use axum::routing::post;
use bytes::Bytes;
use dedup_core::{Admin, DedupStore, Key, MemoryStore, Released};
use dedup_http::{IdempotencyConfig, IdempotencyLayer, InnerBody, ReleasePolicy, StoredResponse};
use http_body_util::{BodyExt, Full};
use tower_layer::Layer;
use tower_service::Service;

struct Reply {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Reply {
    fn replayed(&self) -> bool {
        self.headers.contains_key("idempotency-replayed")
    }
}

async fn call<S, B>(
    app: &mut S,
    method: &str,
    uri: &str,
    key: Option<&str>,
    body: &'static str,
) -> Reply
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    futures::future::poll_fn(|cx| app.poll_ready(cx))
        .await
        .unwrap();
    let response = app
        .call(request.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let (head, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply {
        status: head.status,
        headers: head.headers,
        body,
    }
}

fn memory() -> Arc<dyn DedupStore> {
    Arc::new(MemoryStore::new())
}

/// A router whose one handler counts its runs and answers `status` with `body`.
fn counting(
    route: &str,
    config: IdempotencyConfig,
    store: Arc<dyn DedupStore>,
    status: StatusCode,
    body: &'static str,
) -> (Router, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let handler = move || {
        let counter = Arc::clone(&counter);
        async move {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            let headers = [
                (header::CONTENT_TYPE, "text/plain".to_string()),
                (header::SET_COOKIE, format!("session={n}")),
            ];
            (status, headers, body)
        }
    };
    let router = Router::new()
        .route(route, post(handler.clone()).patch(handler))
        .layer(IdempotencyLayer::with_config(store, config));
    (router, calls)
}

#[tokio::test]
async fn keys_are_scoped_by_the_route_template_and_the_path_is_fingerprinted() {
    let store = memory();
    let (mut app, calls) = counting(
        "/orders/{id}",
        Default::default(),
        store.clone(),
        StatusCode::OK,
        "ok",
    );
    assert_eq!(
        call(&mut app, "PATCH", "/orders/7", Some("k"), "{}")
            .await
            .status,
        StatusCode::OK
    );
    let key = Key::new("http:PATCH /orders/{id}", "k").unwrap();
    assert!(
        store.get(&key).await.unwrap().is_some(),
        "scope is the route template"
    );
    let other = call(&mut app, "PATCH", "/orders/8", Some("k"), "{}").await;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "same scope, another path"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn without_require_key_unkeyed_requests_pass_unguarded() {
    let config = IdempotencyConfig {
        require_key: false,
        ..Default::default()
    };
    let (mut app, calls) = counting("/o", config, memory(), StatusCode::CREATED, "made");
    for _ in 0..2 {
        let reply = call(&mut app, "POST", "/o", None, "{}").await;
        assert_eq!(
            (reply.status, reply.replayed()),
            (StatusCode::CREATED, false)
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_all_errors_policy_releases_client_errors_too() {
    let config = IdempotencyConfig {
        release: ReleasePolicy::AllErrors,
        ..Default::default()
    };
    let (mut app, calls) = counting("/o", config, memory(), StatusCode::CONFLICT, "no");
    for _ in 0..2 {
        let reply = call(&mut app, "POST", "/o", Some("k"), "{}").await;
        assert_eq!(
            (reply.status, reply.replayed()),
            (StatusCode::CONFLICT, false)
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2, "each retry ran again");
}

#[tokio::test]
async fn only_the_chosen_headers_are_stored_and_quoted_keys_equal_bare_ones() {
    let (mut app, calls) = counting(
        "/o",
        Default::default(),
        memory(),
        StatusCode::CREATED,
        "made",
    );
    let first = call(&mut app, "POST", "/o", Some("\"abc\""), "{}").await;
    assert_eq!(first.headers[header::SET_COOKIE], "session=1");
    let replay = call(&mut app, "POST", "/o", Some("abc"), "{}").await;
    assert!(replay.replayed());
    assert_eq!(
        (replay.status, &replay.body),
        (StatusCode::CREATED, &first.body)
    );
    assert_eq!(replay.headers[header::CONTENT_TYPE], "text/plain");
    assert!(
        !replay.headers.contains_key(header::SET_COOKIE),
        "set-cookie is not stored"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_response_too_large_to_store_reaches_the_first_caller_and_replays_as_a_problem() {
    let config = IdempotencyConfig {
        max_stored_body: 8,
        ..Default::default()
    };
    let (mut app, calls) = counting("/o", config, memory(), StatusCode::CREATED, "a long body");
    let first = call(&mut app, "POST", "/o", Some("k"), "{}").await;
    assert_eq!(
        (first.status, &first.body[..]),
        (StatusCode::CREATED, &b"a long body"[..])
    );
    let replay = call(&mut app, "POST", "/o", Some("k"), "{}").await;
    assert!(replay.replayed());
    assert_eq!(replay.status, StatusCode::CREATED, "the original status");
    assert_eq!(
        replay.headers[header::CONTENT_TYPE],
        "application/problem+json"
    );
    let doc: serde_json::Value = serde_json::from_slice(&replay.body).unwrap();
    assert_eq!(doc["type"], "urn:dedup-http:response-not-stored");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A plain tower service (no axum) that fails once, then answers `201`.
#[derive(Clone, Debug)]
struct FlakyOnce(Arc<AtomicUsize>);

impl Service<Request<InnerBody<Full<Bytes>>>> for FlakyOnce {
    type Response = Response<Full<Bytes>>;
    type Error = &'static str;
    type Future = Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<InnerBody<Full<Bytes>>>) -> Self::Future {
        assert!(
            request.extensions().get::<dedup_core::Lease>().is_some(),
            "the lease is passed on"
        );
        let result = match self.0.fetch_add(1, Ordering::SeqCst) {
            0 => Err("connection to the ledger lost"),
            _ => Ok(Response::builder()
                .status(201)
                .body(Full::new(Bytes::from("ok")))
                .unwrap()),
        };
        std::future::ready(result)
    }
}

#[tokio::test]
async fn an_inner_service_error_is_returned_and_releases_the_key() {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut service = IdempotencyLayer::new(memory()).layer(FlakyOnce(Arc::clone(&calls)));
    let request = || {
        Request::post("/o")
            .header("idempotency-key", "k")
            .body(Full::new(Bytes::from("{}")))
            .unwrap()
    };
    assert_eq!(
        service.call(request()).await.err(),
        Some("connection to the ledger lost")
    );
    let retry = service.call(request()).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED, "the retry ran at once");
    let replay = service.call(request()).await.unwrap();
    assert!(replay.headers().contains_key("idempotency-replayed"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A tower service that is never ready: its `poll_ready` fails.
#[derive(Clone)]
struct NeverReady;

impl Service<Request<InnerBody<Full<Bytes>>>> for NeverReady {
    type Response = Response<Full<Bytes>>;
    type Error = &'static str;
    type Future = Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Err("the ledger is down"))
    }

    fn call(&mut self, _: Request<InnerBody<Full<Bytes>>>) -> Self::Future {
        unreachable!("never ready, never called")
    }
}

#[tokio::test]
async fn the_layer_is_ready_when_its_inner_service_is() {
    let mut service = IdempotencyLayer::new(memory()).layer(NeverReady);
    let ready = futures::future::poll_fn(|cx| {
        Service::<Request<Full<Bytes>>>::poll_ready(&mut service, cx)
    })
    .await;
    assert_eq!(ready, Err("the ledger is down"));
}

#[test]
fn the_layer_and_its_service_name_themselves_in_debug() {
    let layer = IdempotencyLayer::new(memory());
    let shown = format!("{layer:?}");
    assert!(shown.starts_with("IdempotencyLayer { config: "), "{shown}");
    let service = layer.layer(FlakyOnce(Arc::new(AtomicUsize::new(0))));
    let shown = format!("{service:?}");
    assert!(
        shown.starts_with("Idempotency { inner: FlakyOnce"),
        "{shown}"
    );
}

/// A keyed `POST /o` with `body`, and its `Content-Length` when given.
fn keyed_post(body: Body, length: Option<usize>) -> Request<Body> {
    let mut request = Request::post("/o").header("idempotency-key", "k");
    if let Some(length) = length {
        request = request.header(header::CONTENT_LENGTH, length);
    }
    request.body(body).unwrap()
}

async fn status_of(app: &mut Router, request: Request<Body>) -> StatusCode {
    futures::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(app, cx))
        .await
        .unwrap();
    app.call(request).await.unwrap().status()
}

#[tokio::test]
async fn a_body_at_the_limit_runs_and_one_byte_more_is_too_large_declared_or_not() {
    let config = IdempotencyConfig {
        max_request_body: 2,
        ..Default::default()
    };
    let (mut app, calls) = counting("/o", config, memory(), StatusCode::CREATED, "ok");
    let declared = keyed_post(Body::from("{}"), Some(2));
    assert_eq!(status_of(&mut app, declared).await, StatusCode::CREATED);
    // Streamed without a length: the limit is found while it is read.
    let chunks = [
        Ok::<_, std::io::Error>(Bytes::from("{}")),
        Ok(Bytes::from("!")),
    ];
    let streamed = keyed_post(Body::from_stream(futures::stream::iter(chunks)), None);
    let status = status_of(&mut app, streamed).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_body_that_fails_while_read_is_unreadable_not_too_large() {
    let (mut app, calls) = counting(
        "/o",
        IdempotencyConfig::default(),
        memory(),
        StatusCode::CREATED,
        "ok",
    );
    let broken = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "client went away");
    let chunks = [Ok(Bytes::from("{")), Err(broken)];
    let request = keyed_post(Body::from_stream(futures::stream::iter(chunks)), None);
    assert_eq!(status_of(&mut app, request).await, StatusCode::BAD_REQUEST);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_response_whose_encoding_is_exactly_the_largest_outcome_keeps_its_body() {
    let config = || IdempotencyConfig {
        max_stored_body: dedup_core::MAX_OUTCOME_LEN,
        ..Default::default()
    };
    // The stored headers a replay carries give the encoding's size without a body.
    let (mut probe, _) = counting("/o", config(), memory(), StatusCode::CREATED, "x");
    call(&mut probe, "POST", "/o", Some("probe"), "{}").await;
    let replay = call(&mut probe, "POST", "/o", Some("probe"), "{}").await;
    let mut headers = http::HeaderMap::new();
    for name in &config().stored_headers {
        for value in replay.headers.get_all(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    let empty = StoredResponse {
        status: StatusCode::CREATED,
        headers,
        body: Some(Bytes::new()),
    };
    let fits = dedup_core::MAX_OUTCOME_LEN - empty.encode().len();
    let body: &'static str = Box::leak("b".repeat(fits).into_boxed_str());
    let (mut app, calls) = counting("/o", config(), memory(), StatusCode::CREATED, body);
    call(&mut app, "POST", "/o", Some("k"), "{}").await;
    let replay = call(&mut app, "POST", "/o", Some("k"), "{}").await;
    assert!(replay.replayed());
    assert_eq!(replay.body.len(), fits, "the body is kept");
    // What was stored is exactly the largest outcome.
    let mut stored = replay.headers.clone();
    stored.remove(header::CONTENT_LENGTH);
    stored.remove("idempotency-replayed");
    let kept = StoredResponse {
        status: replay.status,
        headers: stored,
        body: Some(replay.body.clone()),
    };
    assert_eq!(kept.encode().len(), dedup_core::MAX_OUTCOME_LEN);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A router whose handler has its own lease revoked (as `dedup release --force` does) on
/// its first run, then answers `201` at once, or after `pause` when given. Later runs
/// answer `201` at once.
fn revoked_on_first_run(
    store: Arc<MemoryStore>,
    config: IdempotencyConfig,
    pause: Option<std::time::Duration>,
) -> (Router, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let admin = Arc::clone(&store);
    let handler = move || {
        let (counter, admin) = (Arc::clone(&counter), Arc::clone(&admin));
        async move {
            if counter.fetch_add(1, Ordering::SeqCst) == 0 {
                let key = Key::new("http:POST /o", "k").unwrap();
                let released = admin.release_key(&key, true).await.unwrap();
                assert!(
                    matches!(released, Released::Released { .. }),
                    "{released:?}"
                );
                if let Some(pause) = pause {
                    tokio::time::sleep(pause).await;
                }
            }
            (StatusCode::CREATED, "made")
        }
    };
    let router = Router::new()
        .route("/o", post(handler))
        .layer(IdempotencyLayer::with_config(store, config));
    (router, calls)
}

#[tokio::test]
async fn a_commit_refused_after_the_handler_answered_gives_the_caller_that_answer() {
    let store = Arc::new(MemoryStore::new());
    let (mut app, calls) = revoked_on_first_run(store, IdempotencyConfig::default(), None);
    let first = call(&mut app, "POST", "/o", Some("k"), "{}").await;
    assert_eq!(
        (first.status, &first.body[..], first.replayed()),
        (StatusCode::CREATED, &b"made"[..], false),
        "the commit found the lease revoked; the response was produced all the same"
    );
    let retry = call(&mut app, "POST", "/o", Some("k"), "{}").await;
    assert_eq!(
        (retry.status, retry.replayed()),
        (StatusCode::CREATED, false)
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "nothing was stored: it ran again"
    );
    let replay = call(&mut app, "POST", "/o", Some("k"), "{}").await;
    assert!(replay.replayed());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_lease_lost_before_the_handler_answered_is_503_with_retry_after() {
    let mut config = IdempotencyConfig::default();
    config.lease.renew_every = Some(std::time::Duration::from_millis(10));
    let store = Arc::new(MemoryStore::new());
    let pause = Some(std::time::Duration::from_secs(30));
    let (mut app, calls) = revoked_on_first_run(store, config, pause);
    let started = std::time::Instant::now();
    let first = call(&mut app, "POST", "/o", Some("k"), "{}").await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "the renewal saw the lease lost and dropped the handler"
    );
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(first.headers.contains_key(header::RETRY_AFTER));
    let doc: serde_json::Value = serde_json::from_slice(&first.body).unwrap();
    assert_eq!(doc["type"], "urn:dedup-http:idempotency-store-unavailable");
    let retry = call(&mut app, "POST", "/o", Some("k"), "{}").await;
    assert_eq!(
        (retry.status, retry.replayed()),
        (StatusCode::CREATED, false)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
