//! The console in a real browser: headless Chromium driven through WebDriver
//! (chromedriver), against real SQLite, PostgreSQL and Redis stores seeded with processed,
//! failed, dead-lettered, stuck and outbox rows. Without `chromium` and `chromedriver` the
//! tests skip with a line, or fail under `DEDUP_TEST_STRICT=1`.
//!
//! With `DEDUP_CONSOLE_SCREENSHOTS=DIR`, the SQLite test saves a PNG of each view there
//! (the README's pictures).
//!
//! `browser_nested` mounts the console in a host app as its README shows
//! (`nest("/ops/dedup", ...)`), clicks every link and submits every form, and finds no
//! request under the mount point answered 404 or 5xx.

mod common;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dedup::store::ClaimOptions;
use dedup::{Claim, Error, Key};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

use common::{SCRIPT_KEY, TOKEN, Target};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// chromedriver, ended when dropped.
struct Driver {
    child: Child,
    port: u16,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// chromedriver and a browser session, or `None` (skip) without them.
async fn browser() -> Option<(Driver, Client)> {
    if !Path::new(CHROMIUM).exists() || !Path::new(CHROMEDRIVER).exists() {
        if std::env::var("DEDUP_TEST_STRICT").as_deref() == Ok("1") {
            panic!(
                "{CHROMIUM} or {CHROMEDRIVER} is missing and DEDUP_TEST_STRICT=1 (apt-get install chromium chromium-driver)"
            );
        }
        eprintln!("skipped: {CHROMIUM} or {CHROMEDRIVER} is missing");
        return None;
    }
    let port = free_port();
    let child = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let profile = tempfile::tempdir().expect("profile dir");
    let driver = Driver {
        child,
        port,
        _profile: profile,
    };
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": CHROMIUM,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync",
                "--window-size=1100,850",
                format!("--user-data-dir={}", driver._profile.path().display()),
            ],
        }),
    );
    let url = format!("http://127.0.0.1:{}", driver.port);
    let mut last = None;
    for _ in 0..100 {
        match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps.clone())
            .connect(&url)
            .await
        {
            Ok(client) => return Some((driver, client)),
            Err(e) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    panic!("no WebDriver session from chromedriver: {last:?}");
}

/// Serve `router` on a free loopback port.
async fn serve(router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// The element matching `css`, waiting up to ten seconds for it: after a click that submits
/// a form, the next page may not have loaded yet when the click returns.
async fn element(c: &Client, css: &str) -> fantoccini::elements::Element {
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
}

async fn text(c: &Client, css: &str) -> String {
    element(c, css).await.text().await.unwrap()
}

async fn click(c: &Client, css: &str) {
    element(c, css).await.click().await.unwrap();
}

/// [`shot`] with the element `id` scrolled into view first.
async fn shot_at(c: &Client, dir: &Option<PathBuf>, id: &str, name: &str) {
    let js = format!("document.getElementById('{id}').scrollIntoView()");
    c.execute(&js, vec![]).await.unwrap();
    shot(c, dir, name).await;
}

async fn shot(c: &Client, dir: &Option<PathBuf>, name: &str) {
    if let Some(d) = dir {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join(format!("{name}.png")), c.screenshot().await.unwrap()).unwrap();
    }
}

/// Signs in at `base` with the test token.
async fn sign_in(c: &Client, base: &str) {
    c.goto(&format!("{base}/signin")).await.unwrap();
    submit_token(c).await;
}

/// Submits the sign-in form shown with the test token.
async fn submit_token(c: &Client) {
    c.find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    click(c, "#signin").await;
    assert_eq!(text(c, "#result").await, "Signed in.");
}

async fn acquired(s: &common::Seeded, id: &str) -> bool {
    matches!(
        s.admin
            .claim(
                &Key::new("billing", id).unwrap(),
                &ClaimOptions::lease(Duration::from_secs(30))
            )
            .await
            .unwrap(),
        Claim::Acquired(_)
    )
}

async fn scenario(t: Target, screenshots: Option<PathBuf>) {
    let Some((_driver, c)) = browser().await else {
        return;
    };
    let s = common::seed(&t).await;
    let addr = serve(common::console(&t, &s).router()).await;
    let base = format!("http://{addr}");

    // Before signing in: the confirm page is there, but its write is refused, and
    // nothing changes.
    c.goto(&format!("{base}/failures")).await.unwrap();
    click(&c, "section.group a.action").await;
    click(&c, "#confirm").await;
    assert!(
        text(&c, ".refused")
            .await
            .contains("needs the console's token")
    );
    c.goto(&format!("{base}/failures")).await.unwrap();
    assert_eq!(text(&c, "section.group .count").await, "3");

    // A form on a foreign origin posting to the console (with the real CSRF token) is
    // refused, and nothing changes.
    c.goto(&format!("{base}/confirm/purge")).await.unwrap();
    let csrf = c
        .find(Locator::Css("input[name=csrf]"))
        .await
        .unwrap()
        .attr("value")
        .await
        .unwrap()
        .unwrap();
    let group = c.goto(&format!("{base}/api/failures")).await;
    group.unwrap();
    let f: serde_json::Value = serde_json::from_str(&text(&c, "body").await).unwrap();
    let group = f["groups"][0]["id"].as_str().unwrap().to_owned();
    let evil_page = format!(
        "<form method=post action=\"{base}/act/forget-group\"><input name=csrf value=\"{csrf}\">\
         <input name=id value=\"{group}\"><button id=go>win a prize</button></form>"
    );
    let evil = serve(axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let p = evil_page.clone();
            async move { axum::response::Html(p) }
        }),
    ))
    .await;
    c.goto(&format!("http://localhost:{}/", evil.port()))
        .await
        .unwrap();
    click(&c, "#go").await;
    assert!(text(&c, ".refused").await.contains("foreign origin"));
    c.goto(&format!("{base}/failures")).await.unwrap();
    assert_eq!(
        text(&c, "section.group .count").await,
        "3",
        "nothing changed"
    );

    sign_in(&c, &base).await;

    // The overview shows the seeded counts.
    c.goto(&format!("{base}/")).await.unwrap();
    let row = text(&c, "tr[data-consumer=billing]").await;
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells, ["billing", "3", "1", "0", "3", "1"], "{row}");
    shot(&c, &screenshots, "overview").await;

    // Grouping, and the key holding <script> shows as text (the page title is untouched).
    c.goto(&format!("{base}/failures")).await.unwrap();
    let groups = c.find_all(Locator::Css("section.group")).await.unwrap();
    assert_eq!(groups.len(), 2);
    assert_eq!(text(&c, "section.group .count").await, "3");
    assert!(
        text(&c, "section.group h2")
            .await
            .contains("connection refused")
    );
    assert!(text(&c, "section.group ul").await.contains(SCRIPT_KEY));
    assert_eq!(c.title().await.unwrap(), "Failures · dedup console");
    shot(&c, &screenshots, "failures").await;
    c.goto(&format!("{base}/key?consumer=billing&id=dead-1"))
        .await
        .unwrap();
    assert!(text(&c, "ol.chain").await.contains("root cause: io"));
    shot(&c, &screenshots, "key").await;

    // "Forget group": the next claim of each key is Acquired.
    c.goto(&format!("{base}/failures")).await.unwrap();
    click(&c, "section.group a.action").await;
    shot(&c, &screenshots, "confirm").await;
    click(&c, "#confirm").await;
    assert!(text(&c, "#result").await.contains("Forgot 3 keys"));
    for id in ["fail-1", "dead-1", SCRIPT_KEY] {
        assert!(acquired(&s, id).await, "{id}");
    }

    // "Release": the stale worker's commit gets LeaseLost.
    c.goto(&format!("{base}/stuck?older_than=0s"))
        .await
        .unwrap();
    shot(&c, &screenshots, "stuck").await;
    let release = c
        .find(Locator::XPath(
            "//tr[td/a[text()='stuck-1']]//a[contains(@class,'action')]",
        ))
        .await
        .unwrap();
    release.click().await.unwrap();
    click(&c, "#confirm").await;
    assert!(text(&c, "#result").await.contains("Released"));
    let lost = s.admin.commit(&s.stale, Some(b"late")).await;
    assert!(matches!(lost, Err(Error::LeaseLost { .. })), "{lost:?}");

    // "Retry": the dead outbox row is published again (the relay takes it).
    if let (Some(outbox), Some(id)) = (&s.outbox, s.dead_row) {
        c.goto(&format!("{base}/outbox")).await.unwrap();
        assert!(
            text(&c, "section.group")
                .await
                .contains("tenant: <b>acme</b>")
        );
        shot(&c, &screenshots, "outbox").await;
        click(&c, "section.group td a.action").await;
        click(&c, "#confirm").await;
        assert!(
            text(&c, "#result")
                .await
                .contains(&format!("1 dead outbox rows to pending: {id}"))
        );
        let held = outbox.take(10, Duration::from_secs(30)).await.unwrap();
        assert!(held.rows.iter().any(|r| r.id == id), "{held:?}");
    }
    c.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_sqlite() {
    let shots = std::env::var_os("DEDUP_CONSOLE_SCREENSHOTS").map(PathBuf::from);
    scenario(common::target("sqlite").unwrap(), shots).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_postgres() {
    if let Some(t) = common::target("postgres") {
        scenario(t, None).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_redis() {
    if let Some(t) = common::target("redis") {
        scenario(t, None).await;
    }
}

/// Replay per key, then per failure group, in the browser, against a real consumer on
/// Redis Streams: the message view (the pictures `message` and `group-messages`), the
/// confirmation pages, and each dead-lettered message run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_replay_redis_streams() {
    let Some(b) = common::broker::Broker::start("sqlite").await else {
        return;
    };
    let Some((_driver, c)) = browser().await else {
        b.cleanup().await;
        return;
    };
    let shots = std::env::var_os("DEDUP_CONSOLE_SCREENSHOTS").map(PathBuf::from);
    let addr = serve(b.console().router()).await;
    let base = format!("http://{addr}");
    sign_in(&c, &base).await;

    // The key's message: redacted, its markup shown as text.
    c.goto(&format!("{base}/key?consumer=billing&id=bad-json"))
        .await
        .unwrap();
    let body = text(&c, "#message .message-body").await;
    assert!(body.contains(r#""card":"***""#), "{body}");
    assert!(body.contains("<script>alert(1)</script>"), "{body}");
    assert_eq!(c.title().await.unwrap(), "Key · dedup console");
    shot_at(&c, &shots, "message", "message").await;

    // Fixed; replayed from the key page.
    b.broken.store(false, std::sync::atomic::Ordering::SeqCst);
    click(&c, "a.action[href*='/confirm/replay?']").await;
    assert!(
        text(&c, "main p")
            .await
            .contains("Replay bad-json of billing")
    );
    click(&c, "#confirm").await;
    let done = text(&c, "#result").await;
    assert!(done.contains("Replayed 1 of billing (bad-json)."), "{done}");
    b.ran_once(&["bad-json"]).await;

    // The group's page shows its two other messages; replayed from there.
    c.goto(&format!("{base}/failures")).await.unwrap();
    click(&c, "section.group a[href*='/failures/group?']").await;
    let messages = c.find_all(Locator::Css("details.message")).await.unwrap();
    assert_eq!(messages.len(), 2);
    shot(&c, &shots, "group-messages").await;
    click(&c, "a.action[href*='/confirm/replay-group?']").await;
    click(&c, "#confirm").await;
    let done = text(&c, "#result").await;
    assert!(done.contains("Replayed 2 of billing"), "{done}");
    b.ran_once(&common::broker::BAD).await;
    assert_eq!(b.dead_len().await, 0, "every copy settled");
    c.close().await.unwrap();
    b.cleanup().await;
}

/// Where the console's README nests it.
const NESTED: &str = "/ops/dedup";

/// Every request the host app answered: method and URI, and the status.
type Answered = Arc<Mutex<Vec<(String, u16)>>>;

/// `console` nested at [`NESTED`] in a host app with a route of its own, exactly as the
/// console's README shows, noting every request and its status in `answered`.
async fn serve_nested(console: axum::Router, answered: Answered) -> SocketAddr {
    let app = axum::Router::new()
        .route("/orders", axum::routing::get(|| async { "the host's own" }))
        .nest(NESTED, console)
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let answered = answered.clone();
                async move {
                    let what = format!("{} {}", req.method(), req.uri());
                    let resp = next.run(req).await;
                    answered
                        .lock()
                        .unwrap()
                        .push((what, resp.status().as_u16()));
                    resp
                }
            },
        ));
    serve(app).await
}

/// The absolute targets of the page's links, in document order.
async fn hrefs(c: &Client) -> Vec<String> {
    let mut out = Vec::new();
    for a in c.find_all(Locator::Css("a[href]")).await.unwrap() {
        out.push(a.prop("href").await.unwrap().unwrap_or_default());
    }
    out
}

/// Click the `i`-th link of the page shown and wait until the browser is at `href`, its
/// target.
async fn click_nth(c: &Client, i: usize, href: &str) {
    let page = c.current_url().await.unwrap();
    let links = c.find_all(Locator::Css("a[href]")).await.unwrap();
    let Some(link) = links.get(i) else {
        panic!("{page} has {} links, not {}", links.len(), i + 1);
    };
    link.click().await.unwrap();
    for _ in 0..100 {
        if c.current_url().await.unwrap().as_str() == href {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "clicking {href} on {page} led to {}",
        c.current_url().await.unwrap()
    );
}

/// Click the `i`-th link of `page` (loaded again first), leading to `href`.
async fn click_link(c: &Client, page: &str, i: usize, href: &str) {
    c.goto(page).await.unwrap();
    click_nth(c, i, href).await;
}

/// From `start`, click every link (each distinct target once) of every page under
/// `prefix` the clicks lead to. Gives the pages visited.
async fn click_every_link(c: &Client, start: &str, prefix: &str) -> Vec<String> {
    let mut queue = VecDeque::from([start.to_owned()]);
    let mut visited = Vec::new();
    let mut clicked = HashSet::from([start.to_owned()]);
    while let Some(page) = queue.pop_front() {
        c.goto(&page).await.unwrap();
        let links = hrefs(c).await;
        eprintln!("{page}: {links:?}");
        assert!(!links.is_empty(), "{page} has no links");
        for (i, href) in links.iter().enumerate() {
            assert!(
                href.starts_with(prefix),
                "{page} links out of the console: {href}"
            );
            if clicked.insert(href.clone()) {
                click_link(c, &page, i, href).await;
                queue.push_back(href.clone());
            }
        }
        visited.push(page);
    }
    visited
}

/// Submit the form of the confirmation page `confirm`, see the action done, then click
/// the result page's link back to the overview.
async fn submit_confirmed(c: &Client, confirm: &str, overview: &str) {
    c.goto(confirm).await.unwrap();
    click(c, "#confirm").await;
    assert!(!text(c, "#result").await.is_empty(), "{confirm}");
    let links = hrefs(c).await;
    let i = links
        .iter()
        .rposition(|h| h == overview)
        .expect("a link to the overview");
    click_nth(c, i, overview).await;
}

/// The console nested at `/ops/dedup` in a host app, as the README shows: every link and
/// every form works there (no 404, no 5xx), before and after signing in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_nested() {
    let Some((_driver, c)) = browser().await else {
        return;
    };
    let t = common::target("sqlite").unwrap();
    let s = common::seed(&t).await;
    let answered = Answered::default();
    let console = common::console_at(&t, &s, NESTED).router();
    let addr = serve_nested(console, answered.clone()).await;
    let overview = format!("http://{addr}{NESTED}");

    // Every view, every confirmation page, and their links (views need no token here).
    let pages = click_every_link(&c, &overview, &overview).await;
    let confirms: Vec<&String> = pages.iter().filter(|p| p.contains("/confirm/")).collect();
    for view in [
        "/failures",
        "/failures/group?",
        "/key?",
        "/stuck",
        "/outbox",
        "/confirm/",
    ] {
        let at = format!("{overview}{view}");
        assert!(
            pages.iter().any(|p| p.starts_with(&at)),
            "no {view} page reached: {pages:?}"
        );
    }

    // A write before signing in is refused; the refusal's links lead on: to the overview,
    // and to the sign-in form.
    for to in [overview.clone(), format!("{overview}/signin")] {
        c.goto(confirms[0]).await.unwrap();
        click(&c, "#confirm").await;
        assert!(
            text(&c, ".refused")
                .await
                .contains("needs the console's token")
        );
        let links = hrefs(&c).await;
        let i = links.iter().rposition(|h| *h == to).expect("the link");
        assert!(
            i >= 3,
            "{to} is linked in the refusal, not only in the header"
        );
        click_nth(&c, i, &to).await;
    }
    submit_token(&c).await;

    // Every action's form, signed in: one confirmation page of each action, in an order
    // where each still has its record (a forgotten key cannot be released).
    let mut by_action: BTreeMap<&str, &String> = BTreeMap::new();
    for p in &confirms {
        let action = p[overview.len() + "/confirm/".len()..]
            .split('?')
            .next()
            .unwrap();
        by_action.entry(action).or_insert(p);
    }
    for action in ["release", "outbox-retry", "forget", "forget-group", "purge"] {
        let confirm = by_action
            .get(action)
            .unwrap_or_else(|| panic!("no {action} button reached: {confirms:?}"));
        submit_confirmed(&c, confirm, &overview).await;
    }
    c.close().await.unwrap();

    let answered = answered.lock().unwrap();
    let bad: Vec<_> = answered
        .iter()
        .filter(|(what, status)| what.contains(NESTED) && (*status == 404 || *status >= 500))
        .collect();
    assert!(
        bad.is_empty(),
        "answered 404 or 5xx under {NESTED}: {bad:?}"
    );
    for want in [
        format!("GET {NESTED}"),
        format!("POST {NESTED}/signin"),
        format!("POST {NESTED}/act/forget-group"),
    ] {
        assert!(
            answered
                .iter()
                .any(|(what, status)| *what == want && *status == 200),
            "no {want} answered 200: {answered:?}"
        );
    }
}

/// The overview's flow charts in the browser (the picture `flow`): two consumers
/// processing at changing rates, some messages failing, outbox rows waiting and then
/// published. With `DEDUP_CONSOLE_SCREENSHOTS` it runs three minutes, so the charts have
/// minutes to show; otherwise two seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_flow_charts() {
    let Some((_driver, c)) = browser().await else {
        return;
    };
    let shots = std::env::var_os("DEDUP_CONSOLE_SCREENSHOTS").map(PathBuf::from);
    let t = common::target("sqlite").unwrap();
    let s = common::seed(&t).await;
    let outbox = s.outbox.clone().expect("SQLite has an outbox");
    let console = common::console(&t, &s).with_flow_every(Duration::from_millis(500));
    let addr = serve(console.router()).await;
    let base = format!("http://{addr}");
    let (rounds, pause) = match shots {
        Some(_) => (36, Duration::from_secs(5)),
        None => (5, Duration::from_millis(400)),
    };
    let cause = dedup::inbox::Failure::new(
        "handler",
        vec!["card declined".into()],
        1,
        s.admin.now().await.unwrap(),
        None,
    );
    for r in 0..rounds {
        for (consumer, n) in [("orders", 3 + r % 5), ("billing", 1 + r % 3)] {
            for i in 0..n {
                let key = Key::new(consumer, format!("flow-{r}-{i}")).unwrap();
                let lease = s
                    .admin
                    .claim(&key, &ClaimOptions::default())
                    .await
                    .unwrap()
                    .into_lease()
                    .unwrap();
                let outcome = match i == 0 && r % 4 == 1 {
                    true => dedup::store::Verdict::failed(&cause),
                    false => b"done".to_vec(),
                };
                s.admin.commit(&lease, Some(&outcome)).await.unwrap();
            }
        }
        let row = dedup::outbox::OutboxMessage::new("invoices", format!("flow-{r}"), vec![1]);
        common::enqueue(&t, &[row.unwrap()]).await;
        if r % 6 == 5 {
            let held = outbox.take(100, Duration::from_secs(30)).await.unwrap();
            let ids: Vec<i64> = held.rows.iter().map(|r| r.id).collect();
            outbox.mark_sent(&held.token, &ids).await.unwrap();
        }
        tokio::time::sleep(pause).await;
    }

    c.goto(&format!("{base}/")).await.unwrap();
    let charts = c.find_all(Locator::Css("#flow figure svg")).await.unwrap();
    assert_eq!(charts.len(), 4, "billing, orders, shipping and the outbox");
    let bars = c
        .find_all(Locator::Css("#flow figure[data-consumer=orders] svg rect"))
        .await
        .unwrap();
    assert!(bars.len() > 2, "the legend and bars: {}", bars.len());
    shot_at(&c, &shots, "flow-note", "flow").await;
    c.close().await.unwrap();
}
