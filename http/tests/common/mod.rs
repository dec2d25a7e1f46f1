//! What the HTTP tests share: a store per backend, the orders service behind the layer on a
//! loopback port, and a real HTTP client.

pub mod scenarios;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use dedup_core::DedupStore;
use dedup_http::{IdempotencyConfig, IdempotencyLayer, Principal};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The stores the scenarios run on.
#[derive(Clone, Copy, Debug)]
pub enum Backend {
    /// A fresh SQLite file.
    Sqlite,
    /// A fresh table on `DEDUP_POSTGRES_URL`.
    Postgres,
    /// A fresh key prefix on `DEDUP_REDIS_URL`.
    Redis,
    /// A fresh key prefix on the Redis Cluster of `DEDUP_REDIS_CLUSTER_URLS`.
    RedisCluster,
}

/// A store and whatever must live as long as it.
pub struct TestStore {
    /// The store.
    pub store: Arc<dyn DedupStore>,
    _dir: Option<tempfile::TempDir>,
}

impl Backend {
    /// A store isolated from every other test, or `None` (a skip, printed; a failure under
    /// `DEDUP_TEST_STRICT=1`) when the backend's server is not configured.
    pub async fn store(self, test: &str) -> Option<TestStore> {
        let unique = format!(
            "http_{}_{}",
            &test[..test.len().min(24)],
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let (store, dir): (Arc<dyn DedupStore>, _) = match self {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let store = dedup_sqlite::SqliteStore::open(dir.path().join("dedup.db")).await;
                (Arc::new(store.expect("open sqlite")), Some(dir))
            }
            Backend::Postgres => {
                let url = self.url("DEDUP_POSTGRES_URL", test)?;
                let config = dedup_postgres::PostgresConfig {
                    schema: "dedup_http_test".into(),
                    sql: dedup_postgres::SqlSettings {
                        table: unique,
                        max_connections: 8,
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let store = dedup_postgres::PostgresStore::connect_with(&url, config).await;
                (Arc::new(store.expect("connect postgres")), None)
            }
            Backend::Redis | Backend::RedisCluster => {
                let config = dedup_redis::RedisConfig {
                    prefix: format!("{unique}:"),
                    ..Default::default()
                };
                let store = if let Backend::Redis = self {
                    let url = self.url("DEDUP_REDIS_URL", test)?;
                    dedup_redis::RedisStore::connect_with(&url, config).await
                } else {
                    let urls = self.url("DEDUP_REDIS_CLUSTER_URLS", test)?;
                    let urls: Vec<String> = urls.split(',').map(|u| u.trim().to_owned()).collect();
                    dedup_redis::RedisStore::connect_cluster(&urls, config).await
                };
                (Arc::new(store.expect("connect redis")), None)
            }
        };
        Some(TestStore { store, _dir: dir })
    }

    fn url(self, var: &str, test: &str) -> Option<String> {
        let url = dedup_conformance::server_url(var);
        if url.is_none() {
            eprintln!("SKIPPED {test} on {self:?}: {var} is not set (see scripts/test.sh)");
        }
        url
    }
}

/// The orders service's state: what the handler did, and knobs the scenarios turn.
#[derive(Clone, Default)]
pub struct Orders {
    /// The orders created, as the JSON documents returned.
    pub created: Arc<Mutex<Vec<String>>>,
    /// How often the handler ran.
    pub calls: Arc<AtomicUsize>,
    /// How many of the next calls answer `503`.
    pub fail_next: Arc<AtomicUsize>,
    /// How long each call takes, in milliseconds.
    pub delay_ms: Arc<AtomicU64>,
}

impl Orders {
    /// Orders created so far.
    pub fn count(&self) -> usize {
        self.created.lock().unwrap().len()
    }

    /// Handler runs so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// `POST /orders` with a JSON body `{"item": "..."}`: `201` with the order (and a random
/// nonce, so a replay that re-ran the handler could not match byte for byte), `400` for an
/// empty item, `503` while `fail_next` is positive.
async fn create_order(State(orders): State<Orders>, body: Bytes) -> Response {
    orders.calls.fetch_add(1, Ordering::SeqCst);
    let delay = orders.delay_ms.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(delay)).await;
    let failing = orders
        .fail_next
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    if failing.is_ok() {
        return (StatusCode::SERVICE_UNAVAILABLE, "inventory is down").into_response();
    }
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let item = request["item"].as_str().unwrap_or_default();
    if item.is_empty() {
        let error = r#"{"error":"item is required"}"#;
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/json")],
            error,
        )
            .into_response();
    }
    let mut created = orders.created.lock().unwrap();
    let id = created.len() + 1;
    let order =
        serde_json::json!({"id": id, "item": item, "nonce": uuid::Uuid::new_v4().to_string()})
            .to_string();
    created.push(order.clone());
    let location = format!("/orders/{id}");
    (
        StatusCode::CREATED,
        [
            (header::CONTENT_TYPE, "application/json".to_string()),
            (header::LOCATION, location),
        ],
        order,
    )
        .into_response()
}

async fn count_orders(State(orders): State<Orders>) -> String {
    orders.count().to_string()
}

/// The application's authentication: `x-user` names the principal.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let user = request
        .headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(user) = user {
        request.extensions_mut().insert(Principal(user));
    }
    next.run(request).await
}

/// The orders router behind the layer (and the authentication before it).
pub fn router(store: Arc<dyn DedupStore>, config: IdempotencyConfig, orders: Orders) -> Router {
    Router::new()
        .route("/orders", post(create_order).get(count_orders))
        .layer(IdempotencyLayer::with_config(store, config))
        .layer(middleware::from_fn(authenticate))
        .with_state(orders)
}

/// The router served on a loopback port, with a client for it.
pub struct Server {
    /// The service's state.
    pub orders: Orders,
    /// The store under the layer.
    pub store: Arc<dyn DedupStore>,
    addr: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// One reply as the client received it.
#[derive(Debug)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl Reply {
    /// Whether it carries `Idempotency-Replayed: true`.
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotency-replayed")
            .is_some_and(|v| v == "true")
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", self.body))
    }

    /// Assert it is an RFC 9457 problem with `status` and a `type` ending in `slug`.
    pub fn assert_problem(&self, status: StatusCode, slug: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(
            self.headers[header::CONTENT_TYPE],
            "application/problem+json",
            "{self:?}"
        );
        let doc = self.json();
        assert_eq!(doc["status"], status.as_u16(), "{doc}");
        assert!(
            doc["type"].as_str().is_some_and(|t| t.ends_with(slug)),
            "{doc}"
        );
        assert!(
            doc["title"].is_string() && doc["detail"].is_string(),
            "{doc}"
        );
    }
}

impl Server {
    /// Serve the orders router over `store` with `config` on 127.0.0.1:0.
    pub async fn start(store: Arc<dyn DedupStore>, config: IdempotencyConfig) -> Server {
        let orders = Orders::default();
        let app = router(Arc::clone(&store), config, orders.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        let client = Client::builder(TokioExecutor::new()).build_http();
        Server {
            orders,
            store,
            addr,
            client,
        }
    }

    /// `POST /orders` with `body`, the key (if any) and the user (if any).
    pub async fn post(&self, key: Option<&str>, user: Option<&str>, body: &str) -> Reply {
        self.send("POST", key, user, Bytes::copy_from_slice(body.as_bytes()))
            .await
    }

    /// A request to `/orders`.
    pub async fn send(
        &self,
        method: &str,
        key: Option<&str>,
        user: Option<&str>,
        body: Bytes,
    ) -> Reply {
        let mut request = http::Request::builder()
            .method(method)
            .uri(format!("http://{}/orders", self.addr))
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        if let Some(user) = user {
            request = request.header("x-user", user);
        }
        let request = request.body(Full::new(body)).expect("request");
        let response = self.client.request(request).await.expect("HTTP exchange");
        let (head, body) = response.into_parts();
        let body = body.collect().await.expect("response body").to_bytes();
        Reply {
            status: head.status,
            headers: head.headers,
            body,
        }
    }
}
