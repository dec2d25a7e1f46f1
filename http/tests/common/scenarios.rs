//! The scenarios every backend runs: each takes a fresh store and serves its own router.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::{StatusCode, header};
use dedup_core::{DedupStore, InboxConfig, Key, RecordState};
use dedup_http::IdempotencyConfig;

use super::{Reply, Server};

const TEA: &str = r#"{"item":"tea"}"#;

async fn serve(store: Arc<dyn DedupStore>) -> Server {
    Server::start(store, IdempotencyConfig::default()).await
}

fn assert_created(reply: &Reply) {
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    assert!(
        !reply.replayed(),
        "the first reply is not a replay: {reply:?}"
    );
}

fn assert_replay_of(reply: &Reply, first: &Reply) {
    assert!(reply.replayed(), "replay header missing: {reply:?}");
    assert_eq!(reply.status, first.status);
    assert_eq!(
        reply.body, first.body,
        "a replay is the first body byte for byte"
    );
    for name in [header::CONTENT_TYPE, header::LOCATION] {
        assert_eq!(reply.headers.get(&name), first.headers.get(&name), "{name}");
    }
}

/// One `POST /orders` with a key creates one order; a retry replays it.
pub async fn one_post_with_a_key_creates_one_order(store: Arc<dyn DedupStore>) {
    let server = serve(store).await;
    let first = server.post(Some("order-1"), None, TEA).await;
    assert_created(&first);
    assert_eq!(first.json()["item"], "tea");
    assert_eq!(first.headers[header::LOCATION], "/orders/1");
    let retry = server.post(Some("order-1"), None, TEA).await;
    assert_replay_of(&retry, &first);
    assert_eq!((server.orders.count(), server.orders.calls()), (1, 1));
    let record = server
        .store
        .get(&Key::new("http:POST /orders", "order-1").unwrap())
        .await;
    assert!(
        matches!(
            record.unwrap().unwrap().state,
            RecordState::Completed { .. }
        ),
        "the key is completed in the store"
    );
}

/// 20 concurrent requests with one key: one order; every other reply is the replay or `409`.
pub async fn concurrent_retries_create_one_order(store: Arc<dyn DedupStore>) {
    let server = Arc::new(serve(store).await);
    server.orders.delay_ms.store(800, Ordering::SeqCst);
    let replies = futures::future::join_all((0..20).map(|_| {
        let server = Arc::clone(&server);
        tokio::spawn(async move { server.post(Some("burst"), None, TEA).await })
    }))
    .await;
    let replies: Vec<Reply> = replies
        .into_iter()
        .map(|r| r.expect("request task"))
        .collect();
    let (originals, others): (Vec<_>, Vec<_>) = replies
        .iter()
        .partition(|r| r.status == StatusCode::CREATED && !r.replayed());
    assert_eq!(
        originals.len(),
        1,
        "exactly one request ran the handler: {replies:#?}"
    );
    let first = originals[0];
    let mut conflicts = 0;
    for reply in others {
        if reply.status == StatusCode::CONFLICT {
            reply.assert_problem(StatusCode::CONFLICT, "idempotency-key-in-flight");
            assert_eq!(reply.headers[header::RETRY_AFTER], "1", "{reply:?}");
            conflicts += 1;
        } else {
            assert_replay_of(reply, first);
        }
    }
    assert!(
        conflicts > 0,
        "requests during the 800 ms handler see 409: {replies:#?}"
    );
    assert_replay_of(&server.post(Some("burst"), None, TEA).await, first);
    assert_eq!((server.orders.count(), server.orders.calls()), (1, 1));
}

/// The same key with another body is `422`, and nothing runs.
pub async fn another_body_with_the_same_key_is_422(store: Arc<dyn DedupStore>) {
    let server = serve(store).await;
    assert_created(&server.post(Some("k"), None, TEA).await);
    let other = server.post(Some("k"), None, r#"{"item":"coffee"}"#).await;
    other.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused");
    assert!(!other.replayed());
    assert_eq!((server.orders.count(), server.orders.calls()), (1, 1));
}

/// A guarded request without a key is `400`; a bad key too; other methods pass.
pub async fn missing_key_is_400(store: Arc<dyn DedupStore>) {
    let server = serve(store).await;
    server
        .post(None, None, TEA)
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "idempotency-key-missing");
    server
        .post(Some("\"unterminated"), None, TEA)
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "idempotency-key-invalid");
    let count = server.send("GET", None, None, Default::default()).await;
    assert_eq!(
        (count.status, &count.body[..]),
        (StatusCode::OK, &b"0"[..]),
        "GET is not guarded"
    );
    assert_eq!(server.orders.calls(), 0);
}

/// A `5xx` releases the key: the retry runs the handler again and its answer is stored.
pub async fn server_error_releases_the_key(store: Arc<dyn DedupStore>) {
    let server = serve(store).await;
    server.orders.fail_next.store(1, Ordering::SeqCst);
    let failed = server.post(Some("k5"), None, TEA).await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE, "{failed:?}");
    assert!(!failed.replayed());
    let retry = server.post(Some("k5"), None, TEA).await;
    assert_created(&retry);
    assert_eq!((server.orders.count(), server.orders.calls()), (1, 2));
    assert_replay_of(&server.post(Some("k5"), None, TEA).await, &retry);
    assert_eq!(server.orders.calls(), 2);
}

/// A `4xx` is stored and replayed (the default policy).
pub async fn client_error_is_stored_and_replayed(store: Arc<dyn DedupStore>) {
    let server = serve(store).await;
    let bad = r#"{"item":""}"#;
    let first = server.post(Some("k4"), None, bad).await;
    assert_eq!(
        (first.status, first.replayed()),
        (StatusCode::BAD_REQUEST, false)
    );
    assert_replay_of(&server.post(Some("k4"), None, bad).await, &first);
    assert_eq!(server.orders.calls(), 1);
}

/// The same key from two principals is two operations.
pub async fn keys_of_two_principals_do_not_collide(store: Arc<dyn DedupStore>) {
    let server = serve(store).await;
    let alice = server.post(Some("shared"), Some("alice"), TEA).await;
    let bob = server.post(Some("shared"), Some("bob"), TEA).await;
    assert_created(&alice);
    assert_created(&bob);
    assert_ne!(alice.json()["id"], bob.json()["id"]);
    assert_replay_of(
        &server.post(Some("shared"), Some("alice"), TEA).await,
        &alice,
    );
    assert_replay_of(&server.post(Some("shared"), Some("bob"), TEA).await, &bob);
    assert_eq!((server.orders.count(), server.orders.calls()), (2, 2));
}

/// A body over the limit is `413` before anything is claimed: no record, no handler run,
/// and the key stays free.
pub async fn oversized_body_is_413_and_stores_nothing(store: Arc<dyn DedupStore>) {
    let config = IdempotencyConfig {
        max_request_body: 1024,
        ..IdempotencyConfig::default()
    };
    let server = Server::start(store, config).await;
    let big = format!(r#"{{"item":"{}"}}"#, "x".repeat(2000));
    let reply = server.post(Some("big"), None, &big).await;
    reply.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, "request-body-too-large");
    let key = Key::new("http:POST /orders", "big").unwrap();
    assert_eq!(
        server.store.get(&key).await.unwrap(),
        None,
        "nothing stored"
    );
    assert_eq!(server.orders.calls(), 0);
    assert_created(&server.post(Some("big"), None, TEA).await);
}

/// A handler running longer than its lease keeps the key: renewals hold it, so a retry
/// meanwhile is `409`, not a second run.
pub async fn long_handler_keeps_its_lease(store: Arc<dyn DedupStore>) {
    let config = IdempotencyConfig {
        lease: InboxConfig {
            lease: Duration::from_millis(600),
            renew_every: Some(Duration::from_millis(150)),
            ..InboxConfig::default()
        },
        ..IdempotencyConfig::default()
    };
    let server = Arc::new(Server::start(store, config).await);
    server.orders.delay_ms.store(1800, Ordering::SeqCst);
    let first = tokio::spawn({
        let server = Arc::clone(&server);
        async move { server.post(Some("slow"), None, TEA).await }
    });
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let during = server.post(Some("slow"), None, TEA).await;
    during.assert_problem(StatusCode::CONFLICT, "idempotency-key-in-flight");
    assert_created(&first.await.unwrap());
    assert_eq!(
        server.orders.calls(),
        1,
        "no takeover while the lease was renewed"
    );
}

/// A client that hangs up mid-handler drops the request's future on the server, which
/// releases the key at once: the retry runs instead of waiting out the 30 s lease.
pub async fn client_hangup_releases_the_key(store: Arc<dyn DedupStore>) {
    let server = serve(store).await;
    server.orders.delay_ms.store(5_000, Ordering::SeqCst);
    let hung = tokio::time::timeout(
        Duration::from_millis(300),
        server.post(Some("hang"), None, TEA),
    )
    .await;
    assert!(hung.is_err(), "the client gave up");
    assert_eq!(server.orders.calls(), 1, "the handler had started");
    server.orders.delay_ms.store(0, Ordering::SeqCst);
    // The release runs in the background once the server notices the closed connection.
    let mut last = None;
    for _ in 0..30 {
        let reply = server.post(Some("hang"), None, TEA).await;
        if reply.status != StatusCode::CONFLICT {
            last = Some(reply);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_created(&last.expect("released within 3 s"));
    assert_eq!((server.orders.count(), server.orders.calls()), (1, 2));
}
