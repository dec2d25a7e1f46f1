//! The message view and replay over HTTP, against a real broker (Redis Streams) and a real
//! store. A consumer dead-letters the messages its broken handler fails. The console shows
//! each copy (bounded, escaped, redacted), settling nothing. Once the handler is fixed, it
//! replays one key, then a failure group: each message runs once. Without a broker, the
//! pages say why no message is shown.

mod common;

use std::collections::BTreeMap;

use axum::http::StatusCode;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use serde_json::Value;

use common::broker::{BAD, Broker, CONSUMER, SECRET_HEADER};
use common::web::{csrf, get, json, post};

/// The value of the header `name` in a message's JSON.
fn header<'a>(m: &'a Value, name: &str) -> Option<&'a str> {
    m["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0] == name)
        .and_then(|h| h[1].as_str())
}

/// The scenario over `backend`; false when it skipped (no Redis).
async fn view_then_replay(backend: &'static str) -> bool {
    let Some(b) = Broker::start(backend).await else {
        return false;
    };
    let app = b.console().router();

    // The JSON copy: redacted, UTF-8, its failure headers.
    let k = json(&app, "/api/key?consumer=billing&id=bad-json").await;
    assert_eq!(k["status"], "dead-letter", "{k}");
    let m = &k["message"];
    assert_eq!(
        (&m["state"], &m["redacted"]),
        (&"shown".into(), &true.into()),
        "{k}"
    );
    let body = m["body"]["text"].as_str().unwrap();
    assert!(
        body.contains(r#""card":"***""#) && !body.contains("4242"),
        "{body}"
    );
    assert!(
        body.contains("<script>alert(1)</script>"),
        "the JSON keeps the text: {body}"
    );
    assert_eq!(header(m, SECRET_HEADER), Some("***"), "{m}");
    assert_eq!(header(m, "tenant"), Some("acme"), "{m}");
    assert!(header(m, "dedup-failure-message").is_some_and(|v| v.contains("cannot parse")));
    assert!(m["source"].as_str().unwrap().contains(&b.stream), "{m}");
    assert!(m["origin"].as_str().unwrap().contains(&b.stream), "{m}");

    // A binary body in hex; a long one cut at the limit, saying how much more.
    let bin = json(&app, "/api/key?consumer=billing&id=bad-binary").await;
    assert_eq!(bin["message"]["body"]["encoding"], "hex", "{bin}");
    assert_eq!(bin["message"]["body"]["text"], "00000000  ff 00 41 42\n");
    let big = json(&app, "/api/key?consumer=billing&id=bad-big").await;
    let size = dedup_console::BODY_LIMIT + 100;
    assert_eq!(big["message"]["body"]["size"], size, "{big}");
    assert_eq!(big["message"]["body"]["more"], 100, "{big}");
    let ok = json(&app, "/api/key?consumer=billing&id=ok-1").await;
    assert_eq!(ok["message"]["state"], "not-dead-lettered", "{ok}");

    // The page escapes the body and shows no secret.
    let (_, html) = get(&app, "/key?consumer=billing&id=bad-json").await;
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{html}"
    );
    assert!(!html.contains("<script>alert(1)"), "{html}");
    assert!(!html.contains("4242") && !html.contains("s3cr3t"), "{html}");
    assert!(html.contains("Replay this message"), "{html}");

    // The group page shows the group's messages and offers its replay.
    let f = json(&app, "/api/failures").await;
    assert_eq!(f["groups"][0]["count"], 3, "{f}");
    let group = f["groups"][0]["id"].as_str().unwrap().to_owned();
    let (_, page) = get(&app, &format!("/failures/group?id={group}")).await;
    assert_eq!(page.matches("<details class=message").count(), 3, "{page}");
    assert!(page.contains("Replay group"), "{page}");

    // Viewing settled nothing, and ran nothing.
    assert_eq!(b.dead_len().await, BAD.len());
    assert!(BAD.iter().all(|id| b.runs_of(id) == 0));

    // Fixed. One key, through its confirmation page: refused without the token (nothing
    // done), then replayed.
    b.broken.store(false, std::sync::atomic::Ordering::SeqCst);
    let fence = &k["fence"];
    let (_, confirm) = get(
        &app,
        &format!("/confirm/replay?consumer=billing&id=bad-json&fence={fence}"),
    )
    .await;
    assert!(
        confirm.contains("Replay <strong>bad-json</strong>"),
        "{confirm}"
    );
    let form = format!(
        "csrf={}&consumer={CONSUMER}&id=bad-json&fence={fence}",
        csrf(&confirm)
    );
    let (status, _) = post(&app, "/act/replay", &form, false, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        b.dead_len().await,
        BAD.len(),
        "a refused replay did nothing"
    );
    let (status, done) = post(&app, "/act/replay", &form, true, None).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("Replayed 1 of billing (bad-json)."), "{done}");
    b.ran_once(&["bad-json"]).await;
    assert_eq!(b.dead_len().await, BAD.len() - 1);

    // Clicked again: the fence moved (409, nothing done); with the new fence, no copy is
    // left to replay. The handler ran once.
    let (status, again) = post(&app, "/act/replay", &form, true, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{again}");
    let now = json(&app, "/api/key?consumer=billing&id=bad-json").await;
    let form = format!(
        "csrf={}&consumer={CONSUMER}&id=bad-json&fence={}",
        csrf(&confirm),
        now["fence"]
    );
    let (_, again) = post(&app, "/act/replay", &form, true, None).await;
    assert!(again.contains("Replayed 0 of billing."), "{again}");
    assert!(again.contains("No copy found among the dead letters read: bad-json."));
    b.ran_once(&["bad-json"]).await;

    // The group: its other two keys.
    let (_, confirm) = get(&app, &format!("/confirm/replay-group?id={group}")).await;
    assert!(
        confirm.contains("2 keys (bad-big, bad-binary)"),
        "{confirm}"
    );
    let named = "the group <em>handler: cannot parse the order</em>";
    assert!(confirm.contains(named), "{confirm}");
    let form = format!("csrf={}&id={group}", csrf(&confirm));
    let (status, done) = post(&app, "/act/replay-group", &form, true, None).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("Replayed 2 of billing ("), "{done}");
    assert!(
        done.contains("bad-big") && done.contains("bad-binary"),
        "{done}"
    );
    b.ran_once(&BAD).await;
    assert_eq!(b.dead_len().await, 0, "every copy settled");
    b.cleanup().await;
    true
}

/// `dedup_console_actions_total{action, result}` as one snapshot of `recorder` holds them.
fn actions_counted(recorder: &DebuggingRecorder) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for (key, _, _, value) in recorder.snapshotter().snapshot().into_vec() {
        let (key, DebugValue::Counter(n)) = (key.key(), value) else {
            continue;
        };
        if key.name() != "dedup_console_actions_total" {
            continue;
        }
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
        };
        out.insert((label("action").unwrap(), label("result").unwrap()), n);
    }
    out
}

/// Over SQLite, on a runtime of the test's thread with a recorder of its own: the replays
/// are counted as every action is.
#[test]
fn view_then_replay_over_sqlite() {
    let recorder = DebuggingRecorder::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ran =
        metrics::with_local_recorder(&recorder, || runtime.block_on(view_then_replay("sqlite")));
    if !ran {
        return;
    }
    let counted = actions_counted(&recorder);
    let n = |action: &str, result: &str| counted.get(&(action.into(), result.into())).copied();
    // One replay done, one refused as changed, one that found no copy (done, and its key
    // left); the group's two.
    assert_eq!(n("replay", "done"), Some(2), "{counted:?}");
    assert_eq!(n("replay", "changed"), Some(1), "{counted:?}");
    assert_eq!(n("replay", "left"), Some(1), "{counted:?}");
    assert_eq!(n("replay-group", "done"), Some(2), "{counted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn view_then_replay_over_postgres() {
    view_then_replay("postgres").await;
}

/// No dead letters known, unreachable ones, and a scheme no broker opens: the key page,
/// its JSON and the group page say why no message is shown; a replay does nothing.
#[tokio::test]
async fn without_a_broker_the_pages_say_why() {
    let t = common::target("sqlite").unwrap();
    let s = common::seed(&t).await;
    let app = common::console(&t, &s).router();
    let k = json(&app, "/api/key?consumer=billing&id=dead-1").await;
    assert_eq!(k["message"]["state"], "no-broker", "{k}");
    let why = k["message"]["reason"].as_str().unwrap();
    assert!(why.contains("--dead-letters billing=URL"), "{why}");
    let (_, html) = get(&app, "/key?consumer=billing&id=dead-1").await;
    assert!(html.contains("No message shown: this console knows no dead letters"));
    assert!(!html.contains("Replay this message"), "{html}");
    let f = json(&app, "/api/failures").await;
    let (_, page) = get(
        &app,
        &format!(
            "/failures/group?id={}",
            f["groups"][0]["id"].as_str().unwrap()
        ),
    )
    .await;
    assert!(page.contains("No message of billing shown"), "{page}");

    for (url, says) in [
        (
            "redis://127.0.0.1:1/?stream=orders",
            "cannot open the dead letters at redis://127.0.0.1:1",
        ),
        (
            "ftp://example.test/dead",
            "no dead letters for the scheme \"ftp\"",
        ),
    ] {
        let app = common::console(&t, &s)
            .with_dead_letters("billing", url)
            .router();
        let k = json(&app, "/api/key?consumer=billing&id=dead-1").await;
        assert_eq!(k["message"]["state"], "unreachable", "{k}");
        let why = k["message"]["reason"].as_str().unwrap();
        assert!(why.contains(says), "{why}");
    }

    // A replay without dead letters does nothing, and says so.
    let (_, confirm) = get(&app, "/confirm/replay?consumer=billing&id=dead-1&fence=1").await;
    let form = format!(
        "csrf={}&consumer=billing&id=dead-1&fence={}",
        csrf(&confirm),
        k["fence"]
    );
    let (status, done) = post(&app, "/act/replay", &form, true, None).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(
        done.contains("Nothing replayed for billing: this console knows no dead letters"),
        "{done}"
    );
    let k = json(&app, "/api/key?consumer=billing&id=dead-1").await;
    assert_eq!(k["status"], "dead-letter", "still dead-lettered: {k}");
}
