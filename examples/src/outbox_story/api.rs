//! The orders API: `POST /orders {"id", "item"}` behind `dedup-http`'s `Idempotency-Key`
//! layer writes the order and its `OrderPlaced` message in one transaction.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use dedup_core::DedupStore;
use dedup_core::outbox::OutboxMessage;
use dedup_http::IdempotencyLayer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{BoxError, Db, Names};

#[derive(Clone)]
struct Api {
    db: Db,
    names: Names,
    /// Where `OrderPlaced` goes.
    destination: String,
}

/// Serve the API on `127.0.0.1:0`, writing `OrderPlaced` to `destination`; returns its
/// address. Runs until the runtime ends.
pub async fn serve(db: Db, names: Names, destination: String) -> Result<SocketAddr, BoxError> {
    let guard: Arc<dyn DedupStore> = db.dedup();
    let api = Api {
        db,
        names,
        destination,
    };
    let app = Router::new()
        .route("/orders", post(place))
        .layer(IdempotencyLayer::new(guard))
        .with_state(api);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}

/// The order and `OrderPlaced` (message id `order-placed-ID`) in one transaction; the
/// order row is written once even if a retry gets past the idempotency layer (a key whose
/// first request's lease ran out), and so is the message (its id is kept once).
async fn place(State(api): State<Api>, body: Bytes) -> Response {
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let (Some(id), Some(item)) = (request["id"].as_str(), request["item"].as_str()) else {
        return (StatusCode::BAD_REQUEST, "id and item are required").into_response();
    };
    match write(&api, id, item).await {
        Ok(()) => (StatusCode::CREATED, format!("order {id}")).into_response(),
        // A 5xx releases the idempotency key: the client's retry runs again.
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

async fn write(api: &Api, id: &str, item: &str) -> Result<(), BoxError> {
    let placed = OutboxMessage::new(
        api.destination.clone(),
        format!("order-placed-{id}"),
        serde_json::json!({"order_id": id, "item": item}).to_string(),
    )?
    .header("type", "OrderPlaced")?;
    api.db.place_order(&api.names, id, item, placed).await
}

/// `POST /orders` with `key` as its `Idempotency-Key`, over a plain HTTP/1.1 connection;
/// returns the status code.
pub async fn post_order(
    addr: SocketAddr,
    key: &str,
    id: &str,
    item: &str,
) -> Result<u16, BoxError> {
    let body = serde_json::json!({"id": id, "item": item}).to_string();
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!(
        "POST /orders HTTP/1.1\r\nHost: {addr}\r\nIdempotency-Key: {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {text:.80}"))?;
    Ok(status)
}
