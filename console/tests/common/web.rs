//! Requests to the console's router (tower `oneshot`), as the HTTP tests send them.

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

use super::TOKEN;

pub async fn send(app: &Router, req: Request<Body>) -> (StatusCode, String) {
    let resp = app.clone().oneshot(req).await.expect("the router answers");
    let status = resp.status();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

pub async fn get(app: &Router, path: &str) -> (StatusCode, String) {
    send(
        app,
        Request::get(path)
            .header(header::HOST, "console.test")
            .body(Body::empty())
            .unwrap(),
    )
    .await
}

pub async fn json(app: &Router, path: &str) -> Value {
    let (status, body) = get(app, path).await;
    assert_eq!(status, StatusCode::OK, "{path}: {body}");
    serde_json::from_str(&body).expect("JSON")
}

/// The CSRF token a confirmation page's form carries.
pub fn csrf(page: &str) -> String {
    let at = page.find("name=csrf value=\"").expect("a CSRF field") + 17;
    page[at..at + page[at..].find('"').unwrap()].to_owned()
}

/// POST a form to `path` with `fields`, the token (or not) and an `Origin` (or not).
pub async fn post(
    app: &Router,
    path: &str,
    fields: &str,
    token: bool,
    origin: Option<&str>,
) -> (StatusCode, String) {
    let mut req = Request::post(path)
        .header(header::HOST, "console.test")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {TOKEN}"));
    }
    if let Some(o) = origin {
        req = req.header(header::ORIGIN, o);
    }
    send(app, req.body(Body::from(fields.to_owned())).unwrap()).await
}

pub fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
