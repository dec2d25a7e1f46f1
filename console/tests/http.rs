//! The console over HTTP (tower `oneshot` on its router) against real SQLite, PostgreSQL
//! and Redis stores: what each view shows of a seeded store, and what each action changes
//! (and that a refused one changes nothing).

mod common;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use dedup::store::ClaimOptions;
use dedup::{Claim, Error, Key};
use serde_json::Value;

use common::web::{csrf, enc, get, json, post, send};
use common::{SCRIPT_KEY, TOKEN, Target};

async fn scenario(t: Target) {
    let s = common::seed(&t).await;
    let app = common::console(&t, &s).router();

    // Overview: the seeded counts per consumer, and the outbox.
    let o = json(&app, "/api/overview").await;
    let billing = o["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["consumer"] == "billing")
        .expect("billing");
    assert_eq!(billing["processed"], 3, "{o}");
    assert_eq!(billing["failed"], 3, "{o}");
    assert_eq!(billing["dead_lettered"], 1, "{o}");
    assert_eq!(billing["in_flight"], 1, "{o}");
    assert_eq!(o["oldest_lease"]["message_id"], "stuck-1");
    assert!(!o["store"].as_str().unwrap().contains(":secret@"));
    if s.outbox.is_some() {
        assert_eq!(o["outbox"]["dead"], 1, "{o}");
        assert_eq!(o["outbox"]["pending"], 1, "{o}");
        let invoices = &o["outbox"]["destinations"][0];
        assert_eq!(
            (
                &invoices["destination"],
                &invoices["pending"],
                &invoices["dead"]
            ),
            (
                &serde_json::json!("invoices"),
                &Value::from(1),
                &Value::from(1)
            ),
            "{o}"
        );
        let (_, page) = get(&app, "/").await;
        assert!(
            page.contains("<tr data-destination=\"invoices\"><td>invoices</td>"),
            "{page}"
        );
    }
    assert!(o["last_purge"].is_null(), "no purge ran yet: {o}");
    assert_eq!(o["counts_source"], "scan", "{o}");
    assert_eq!(
        o["counts_hint"],
        Value::Null,
        "a small store needs no advice: {o}"
    );
    if t.backend != "redis" {
        // With kept counts: the same counts, and the page says where they came from.
        assert!(s.admin.enable_counts().await.expect("enable_counts"));
        let kept = json(&app, "/api/overview").await;
        assert_eq!(kept["counts_source"], "kept", "{kept}");
        assert_eq!(kept["consumers"], o["consumers"], "{kept}");
        assert_eq!(kept["oldest_lease"], o["oldest_lease"], "{kept}");
        let (_, html) = get(&app, "/").await;
        assert!(html.contains("counts kept by the store"), "{html}");
        assert!(s.admin.disable_counts().await.expect("disable_counts"));
    }

    // Failures grouped by kind and first line.
    let f = json(&app, "/api/failures").await;
    let groups = f["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{f}");
    assert_eq!(groups[0]["first_line"], "connection refused");
    assert_eq!(groups[0]["count"], 3);
    assert_eq!(groups[1]["first_line"], "invalid amount");
    assert_eq!(groups[1]["count"], 1);
    let group = groups[0]["id"].as_str().unwrap().to_owned();

    // The key holding markup renders as text.
    let (_, html) = get(&app, "/failures").await;
    assert!(
        html.contains("&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;"),
        "{html}"
    );
    assert!(!html.contains(SCRIPT_KEY));
    let (status, html) = get(
        &app,
        &format!("/key?consumer=billing&id={}", enc(SCRIPT_KEY)),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !html.contains(SCRIPT_KEY) && html.contains("root cause: io"),
        "{html}"
    );

    // One key in full.
    let k = json(&app, "/api/key?consumer=billing&id=dead-1").await;
    assert_eq!(k["status"], "dead-letter");
    assert_eq!(k["failure"]["chain"][1], "root cause: io");
    assert_eq!(k["failure"]["worker"], "worker-7");

    // Stuck leases past a threshold.
    let st = json(&app, "/api/stuck").await;
    assert_eq!(
        st["leases"].as_array().unwrap().len(),
        0,
        "a fresh lease is not stuck at 5 min: {st}"
    );
    let st = json(&app, "/api/stuck?older_than=0s").await;
    assert_eq!(st["leases"][0]["message_id"], "stuck-1", "{st}");
    let fence = st["leases"][0]["fence"].as_u64().unwrap();

    // Forget a group: refused without the token, from a foreign origin, or without the
    // CSRF field, and nothing changes; then done.
    let (_, confirm) = get(&app, &format!("/confirm/forget-group?id={group}")).await;
    assert!(confirm.contains("<strong>3</strong> keys"), "{confirm}");
    let token = csrf(&confirm);
    let form = format!("csrf={token}&id={group}");
    let (status, _) = post(&app, "/act/forget-group", &form, false, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = post(
        &app,
        "/act/forget-group",
        &form,
        true,
        Some("http://evil.test"),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = post(
        &app,
        "/act/forget-group",
        &format!("id={group}"),
        true,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        json(&app, "/api/failures").await["groups"][0]["count"],
        3,
        "nothing changed"
    );
    let (status, done) = post(
        &app,
        "/act/forget-group",
        &form,
        true,
        Some("http://console.test"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("Forgot 3 keys"), "{done}");
    for id in ["fail-1", "dead-1", SCRIPT_KEY] {
        let c = s
            .admin
            .claim(
                &Key::new("billing", id).unwrap(),
                &ClaimOptions::lease(Duration::from_secs(30)),
            )
            .await
            .unwrap();
        assert!(matches!(c, Claim::Acquired(_)), "{id}: {c:?}");
    }

    // Release a stuck lease: a stale fence is refused; then the stale worker's commit
    // gets LeaseLost.
    let stale_form = format!(
        "csrf={token}&consumer=billing&id=stuck-1&fence={}",
        fence + 1
    );
    let (status, _) = post(&app, "/act/release", &stale_form, true, None).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let form = format!("csrf={token}&consumer=billing&id=stuck-1&fence={fence}");
    let (status, done) = post(&app, "/act/release", &form, true, None).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("Released"), "{done}");
    let lost = s.admin.commit(&s.stale, Some(b"late")).await;
    assert!(matches!(lost, Err(Error::LeaseLost { .. })), "{lost:?}");

    // Retry a dead outbox row: the relay takes it again.
    if let (Some(outbox), Some(id)) = (&s.outbox, s.dead_row) {
        let (_, page) = get(&app, "/outbox").await;
        assert!(
            page.contains("&lt;b&gt;acme&lt;/b&gt;") && page.contains("42 B"),
            "{page}"
        );
        let (status, done) = post(
            &app,
            "/act/outbox-retry",
            &format!("csrf={token}&id={id}"),
            true,
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{done}");
        let held = outbox.take(10, Duration::from_secs(30)).await.unwrap();
        assert!(
            held.rows.iter().any(|r| r.id == id),
            "republished: {held:?}"
        );
    }

    // A purge by another process (another handle on the store) is shown on the overview.
    let other = dedup::open_admin(&t.url).await.expect("a second handle");
    let options = dedup::purge::PurgeOptions::older_than(Duration::from_secs(7 * 24 * 3600));
    other.purge(&options.max_batches(1)).await.expect("purge");
    let last = json(&app, "/api/overview").await["last_purge"].clone();
    assert_eq!(last["removed"], 0, "{last}");
    let (_, page) = get(&app, "/").await;
    assert!(page.contains("Last purge: finished "), "{page}");

    // Purge now, shown on the overview as the latest run.
    let (status, done) = post(&app, "/act/purge", &format!("csrf={token}"), true, None).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    let last = json(&app, "/api/overview").await["last_purge"].clone();
    assert_eq!(last["stopped_early"], false, "{last}");
    assert!(last["finished_at"].as_i64().is_some(), "{last}");
}

/// A read-only console offers no action and refuses every write, token or not.
#[tokio::test]
async fn read_only_refuses_writes() {
    let t = common::target("sqlite").unwrap();
    let s = common::seed(&t).await;
    let mut config = dedup_console::ConsoleConfig::default();
    config.token = Some(TOKEN.into());
    let app = dedup_console::Console::new(s.admin.clone(), &t.url, config)
        .unwrap()
        .router();
    let (_, html) = get(&app, "/failures").await;
    assert!(!html.contains("Forget group"));
    let (status, _) = post(&app, "/act/purge", "csrf=x", true, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

/// Views need the token when configured so (beyond loopback), and a password in the URL
/// is never shown.
#[tokio::test]
async fn views_need_the_token_and_hide_passwords() {
    let t = common::target("sqlite").unwrap();
    let s = common::seed(&t).await;
    let mut config = dedup_console::ConsoleConfig::default();
    config.token = Some(TOKEN.into());
    config.views_need_token = true;
    let app = dedup_console::Console::new(s.admin.clone(), "postgres://app:secret@db/x", config)
        .unwrap()
        .router();
    assert_eq!(get(&app, "/api/overview").await.0, StatusCode::UNAUTHORIZED);
    let req = Request::get("/")
        .header(header::COOKIE, format!("dedup_console_token={TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let (status, html) = send(&app, req).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!html.contains("secret"), "{html}");
    let mut bad = dedup_console::ConsoleConfig::default();
    bad.allow_writes = true;
    assert!(dedup_console::Console::new(s.admin.clone(), &t.url, bad).is_err());
}

/// POST a JSON action to `/api/act/{action}` with `body`, the token (or not) and an
/// `Origin` (or not); the answer parsed.
async fn post_json(
    app: &Router,
    action: &str,
    body: Value,
    token: bool,
    origin: Option<&str>,
) -> (StatusCode, Value) {
    let mut req = Request::post(format!("/api/act/{action}"))
        .header(header::HOST, "console.test")
        .header(header::CONTENT_TYPE, "application/json");
    if token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {TOKEN}"));
    }
    if let Some(o) = origin {
        req = req.header(header::ORIGIN, o);
    }
    let (status, text) = send(app, req.body(Body::from(body.to_string())).unwrap()).await;
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, v)
}

/// The actions as JSON under `/api/act`: the CSRF token from `/api/session`, refused
/// without the token, from a foreign origin or without the CSRF token (JSON errors, nothing
/// changed), fenced, and answering what they changed.
async fn api_actions(t: Target) {
    let s = common::seed(&t).await;
    let app = common::console(&t, &s).router();
    let session = json(&app, "/api/session").await;
    assert_eq!(session["writes_allowed"], true, "{session}");
    assert_eq!(session["authenticated"], false, "{session}");
    let csrf = session["csrf"].as_str().expect("a CSRF token").to_owned();
    let groups = json(&app, "/api/failures").await;
    let group = groups["groups"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(groups["groups"][0]["count"], 3, "{groups}");

    let form = serde_json::json!({ "csrf": csrf, "id": group });
    let (status, err) = post_json(&app, "forget-group", form.clone(), false, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{err}");
    assert_eq!(err["status"], 401, "{err}");
    let (status, err) = post_json(
        &app,
        "forget-group",
        form.clone(),
        true,
        Some("http://evil.test"),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{err}");
    assert!(
        err["error"].as_str().unwrap().contains("foreign origin"),
        "{err}"
    );
    let (status, err) = post_json(
        &app,
        "forget-group",
        serde_json::json!({ "id": group }),
        true,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{err}");
    let (status, err) = post_json(&app, "no-such-action", form.clone(), true, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{err}");
    assert_eq!(
        json(&app, "/api/failures").await["groups"][0]["count"],
        3,
        "nothing changed"
    );

    let (status, done) = post_json(
        &app,
        "forget-group",
        form,
        true,
        Some("http://console.test"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["action"], "forget-group", "{done}");
    assert_eq!(done["changed"], 3, "{done}");
    for id in ["fail-1", "dead-1", SCRIPT_KEY] {
        let c = s
            .admin
            .claim(
                &Key::new("billing", id).unwrap(),
                &ClaimOptions::lease(Duration::from_secs(30)),
            )
            .await
            .unwrap();
        assert!(matches!(c, Claim::Acquired(_)), "{id}: {c:?}");
    }

    // Release, fenced: a stale fence is a JSON 409 and nothing changes.
    let st = json(&app, "/api/stuck?older_than=0s").await;
    let lease = st["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["message_id"] == "stuck-1")
        .expect("stuck-1 in flight");
    let fence = lease["fence"].as_u64().unwrap();
    let stale = serde_json::json!({
        "csrf": csrf, "consumer": "billing", "id": "stuck-1", "fence": fence + 1
    });
    let (status, err) = post_json(&app, "release", stale, true, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");
    let release = serde_json::json!({
        "csrf": csrf, "consumer": "billing", "id": "stuck-1", "fence": fence
    });
    let (status, done) = post_json(&app, "release", release, true, None).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["changed"], 1, "{done}");
    let lost = s.admin.commit(&s.stale, Some(b"late")).await;
    assert!(matches!(lost, Err(Error::LeaseLost { .. })), "{lost:?}");

    // Retry every dead outbox row.
    if let (Some(outbox), Some(id)) = (&s.outbox, s.dead_row) {
        let all = serde_json::json!({ "csrf": csrf, "all": "1" });
        let (status, done) = post_json(&app, "outbox-retry", all, true, None).await;
        assert_eq!(status, StatusCode::OK, "{done}");
        assert_eq!(done["changed"], 1, "{done}");
        let held = outbox.take(10, Duration::from_secs(30)).await.unwrap();
        assert!(
            held.rows.iter().any(|r| r.id == id),
            "republished: {held:?}"
        );
    }
}

#[tokio::test]
async fn api_actions_over_sqlite() {
    api_actions(common::target("sqlite").unwrap()).await;
}

#[tokio::test]
async fn api_actions_over_postgres() {
    if let Some(t) = common::target("postgres") {
        api_actions(t).await;
    }
}

/// A read-only console refuses a JSON action, as JSON.
#[tokio::test]
async fn api_actions_refused_when_read_only() {
    let t = common::target("sqlite").unwrap();
    let s = common::seed(&t).await;
    let mut config = dedup_console::ConsoleConfig::default();
    config.token = Some(TOKEN.into());
    let app = dedup_console::Console::new(s.admin.clone(), &t.url, config)
        .unwrap()
        .router();
    let session = json(&app, "/api/session").await;
    assert_eq!(session["writes_allowed"], false, "{session}");
    let body = serde_json::json!({ "csrf": session["csrf"] });
    let (status, err) = post_json(&app, "purge", body, true, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{err}");
    assert!(
        err["error"].as_str().unwrap().contains("read-only"),
        "{err}"
    );
}

#[tokio::test]
async fn console_over_sqlite() {
    scenario(common::target("sqlite").unwrap()).await;
}

#[tokio::test]
async fn console_over_postgres() {
    if let Some(t) = common::target("postgres") {
        scenario(t).await;
    }
}

#[tokio::test]
async fn console_over_redis() {
    if let Some(t) = common::target("redis") {
        scenario(t).await;
    }
}

/// Nested as the README shows, error pages and refusals link under the mount point too,
/// and a console without an outbox links no outbox page.
#[tokio::test]
async fn nested_error_pages_link_under_the_mount_point() {
    let Some(t) = common::target("redis") else {
        return;
    };
    let s = common::seed(&t).await;
    let base = "/ops/dedup";
    let app = Router::new().nest(base, common::console_at(&t, &s, base).router());
    let (status, overview) = get(&app, base).await;
    assert_eq!(status, StatusCode::OK, "{overview}");
    let (status, trailing) = get(&app, &format!("{base}/")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "axum's nest: {trailing}");
    assert!(
        !overview.contains(&format!("href=\"{base}/\"")),
        "{overview}"
    );
    assert!(
        !overview.contains("/outbox\""),
        "no outbox here: {overview}"
    );
    let (status, missing) = get(&app, &format!("{base}/key?consumer=billing&id=nope")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{missing}");
    let (status, refused) = send(
        &app,
        Request::post(format!("{base}/act/purge"))
            .header(header::HOST, "console.test")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from("csrf=stale"))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    for page in [&missing, &refused] {
        assert!(
            page.contains(&format!("<a href=\"{base}\">Overview</a>")),
            "{page}"
        );
        assert!(
            page.contains(&format!("href=\"{base}/failures\"")),
            "{page}"
        );
        assert!(!page.contains("/outbox\""), "{page}");
    }
    assert!(
        refused.contains(&format!("href=\"{base}/signin\"")),
        "{refused}"
    );
}
