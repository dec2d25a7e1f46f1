//! An orders API whose `POST /orders` is idempotent per `Idempotency-Key`, through
//! `dedup-http`'s layer on any store (by default an SQLite file in a temporary folder).
//!
//! ```sh
//! cargo run -p dedup-examples --features full --bin http_orders -- --listen 127.0.0.1:3000
//! curl -i -X POST localhost:3000/orders -H 'Idempotency-Key: 7f1c' -d '{"item":"tea"}'
//! ```
//!
//! Prints `listening on http://ADDR` once it accepts connections; runs until killed.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use clap::Parser;
use dedup_core::Lease;
use dedup_http::{IdempotencyLayer, Principal};

/// Serve an idempotent orders API.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Store URL: `sqlite:PATH` (default: a temporary file), `memory:`, `postgres://...`,
    /// `redis://...`.
    #[arg(long)]
    store: Option<String>,
    /// Address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: String,
}

/// The orders created, as returned.
#[derive(Clone, Default)]
struct Orders(Arc<Mutex<Vec<serde_json::Value>>>);

/// `POST /orders {"item": "..."}`: `201` with the new order, `400` without an item.
async fn create(
    State(orders): State<Orders>,
    lease: axum::Extension<Lease>,
    body: Bytes,
) -> Response {
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let Some(item) = request["item"].as_str().filter(|i| !i.is_empty()) else {
        let error = serde_json::json!({"error": "item is required"}).to_string();
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/json")],
            error,
        )
            .into_response();
    };
    let mut all = orders.0.lock().expect("orders lock");
    let order = serde_json::json!({
        "id": all.len() + 1,
        "item": item,
        // Stable across retries of this key: what a payment provider would get.
        "payment_idempotency_key": lease.idempotency_key(),
    });
    all.push(order.clone());
    let location = format!("/orders/{}", all.len());
    let headers = [
        (header::CONTENT_TYPE, "application/json".to_string()),
        (header::LOCATION, location),
    ];
    (StatusCode::CREATED, headers, order.to_string()).into_response()
}

/// `GET /orders`: every order so far (not guarded: GET is not in the layer's methods).
async fn list(State(orders): State<Orders>) -> Response {
    let all = orders.0.lock().expect("orders lock").clone();
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::Value::from(all).to_string(),
    )
        .into_response()
}

/// Stand-in authentication: `Authorization: Bearer NAME` makes NAME the principal that
/// keys are scoped by (a real service verifies a token here).
async fn authenticate(mut request: Request, next: Next) -> Response {
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if let Some(name) = bearer.and_then(|v| v.strip_prefix("Bearer ")) {
        let principal = Principal(name.to_owned());
        request.extensions_mut().insert(principal);
    }
    next.run(request).await
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dedup_examples::exit::report(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let tmp = tempfile::tempdir()?;
    let url = dedup_examples::url_or_temp_sqlite(args.store, tmp.path(), "http_orders.db");
    let store = dedup::open(&url).await?;
    let app = Router::new()
        .route("/orders", post(create).get(list))
        .layer(IdempotencyLayer::new(store))
        .layer(middleware::from_fn(authenticate))
        .with_state(Orders::default());
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
