//! The flow: `/api/flow` counts what consumers processed after the console started, on
//! real SQLite and PostgreSQL; the overview draws it as well-formed SVG.

mod common;

use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use common::web::{get, json};
use dedup::outbox::OutboxMessage;
use dedup::store::{ClaimOptions, Verdict};
use dedup::{Admin, Key};
use dedup_console::{Console, ConsoleConfig};
use serde_json::Value;

/// The sum of a per-minute series (`null`s skipped).
fn sum(series: &Value) -> u64 {
    series
        .as_array()
        .expect("a series")
        .iter()
        .filter_map(Value::as_u64)
        .sum()
}

/// The consumer's line of a flow.
fn line<'a>(flow: &'a Value, consumer: &str) -> Option<&'a Value> {
    flow["consumers"]
        .as_array()?
        .iter()
        .find(|c| c["consumer"] == consumer)
}

/// Asks `/api/flow` until `done` holds, or fails after 15 s.
async fn flow_until(app: &Router, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let flow = json(app, "/api/flow").await;
        if done(&flow) {
            return flow;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "{what}: {flow}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Processes `n` messages of `consumer`, each committed with `outcome`.
async fn process(admin: &dyn Admin, consumer: &str, prefix: &str, n: usize, outcome: &[u8]) {
    for i in 0..n {
        let key = Key::new(consumer, format!("{prefix}-{i}")).unwrap();
        let claim = admin.claim(&key, &ClaimOptions::default()).await.unwrap();
        let lease = claim.into_lease().expect("a new key is acquired");
        admin.commit(&lease, Some(outcome)).await.unwrap();
    }
}

async fn counts_what_was_processed_since_it_started(backend: &'static str) {
    let Some(t) = common::target(backend) else {
        return;
    };
    // Records from before the console started are not flow: it never saw them arrive.
    let s = common::seed(&t).await;
    let console = Console::new(s.admin.clone(), &t.url, ConsoleConfig::default())
        .unwrap()
        .with_outbox(s.outbox.clone().expect("SQL stores have an outbox"))
        .with_flow_every(Duration::from_millis(100));
    let app = console.router();
    flow_until(&app, "a first sample", |f| f["samples"].as_u64() >= Some(1)).await;

    let failure = dedup::inbox::Failure::new(
        "handler",
        vec!["card declined".into()],
        1,
        s.admin.now().await.unwrap(),
        None,
    );
    process(s.admin.as_ref(), "orders", "ok", 7, b"done").await;
    process(
        s.admin.as_ref(),
        "orders",
        "failed",
        2,
        &Verdict::failed(&failure),
    )
    .await;
    process(
        s.admin.as_ref(),
        "orders",
        "dead",
        1,
        &Verdict::dead_letter(3, Some(&failure)),
    )
    .await;
    let rows = [
        OutboxMessage::new("invoices", "flow-1", b"{}".to_vec()).unwrap(),
        OutboxMessage::new("invoices", "flow-2", b"{}".to_vec()).unwrap(),
    ];
    common::enqueue(&t, &rows).await;

    let seen = |f: &Value| {
        line(f, "orders").is_some_and(|o| sum(&o["processed"]) == 7 && sum(&o["failed"]) == 3)
    };
    flow_until(&app, "7 processed and 3 failed", seen).await;
    // More samples count nothing twice.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let flow = json(&app, "/api/flow").await;
    assert!(seen(&flow), "{flow}");
    assert_eq!(flow["source"], "sampled");
    assert_eq!(
        flow["consumers"][0]["processed"].as_array().unwrap().len(),
        60
    );
    let billing = line(&flow, "billing").expect("billing was sampled");
    assert_eq!(
        sum(&billing["processed"]),
        0,
        "seeded before the start: {flow}"
    );
    assert_eq!(sum(&billing["failed"]), 0, "{flow}");

    // The seed left one row pending; two more were written.
    let flow = flow_until(&app, "3 rows waiting", |f| {
        f["outbox"]["waiting"]
            .as_array()
            .is_some_and(|w| w.iter().any(|v| v.as_u64() == Some(3)))
    })
    .await;
    let lags = flow["outbox"]["lag_ms"].as_array().unwrap();
    assert!(lags.iter().any(|v| v.as_u64() > Some(0)), "{flow}");

    // The overview draws one chart per consumer and the outbox's lag, each valid SVG.
    let (status, page) = get(&app, "/").await;
    assert_eq!(status, StatusCode::OK);
    let charts = svgs(&page);
    assert_eq!(
        charts.len(),
        3 + 1,
        "billing, orders, shipping, the outbox: {page}"
    );
    let orders = page
        .find("<figure data-consumer=\"orders\">")
        .expect("the orders chart");
    let orders = &svgs(&page[orders..])[0];
    let doc = roxmltree::Document::parse(orders).expect("well-formed SVG");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        root.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    let bars: Vec<String> = root
        .children()
        .filter(|n| n.has_tag_name("rect"))
        .filter_map(|n| n.children().find(|c| c.has_tag_name("title")))
        .filter_map(|t| t.text().map(str::to_owned))
        .collect();
    let counted = |label: &str| -> u64 {
        bars.iter()
            .filter_map(|b| b.strip_prefix(label))
            .filter_map(|b| b.split(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    assert_eq!(counted("processed: "), 7, "{bars:?}");
    assert_eq!(counted("failed: "), 3, "{bars:?}");
    for chart in &charts {
        roxmltree::Document::parse(chart).unwrap_or_else(|e| panic!("{e}: {chart}"));
    }
}

/// Each `<svg>...</svg>` of `page`.
fn svgs(page: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = page;
    while let Some(start) = rest.find("<svg") {
        let end = rest[start..].find("</svg>").expect("a closed svg") + start + 6;
        out.push(rest[start..end].to_owned());
        rest = &rest[end..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_flow_counts_what_was_processed_since_it_started() {
    counts_what_was_processed_since_it_started("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_flow_counts_what_was_processed_since_it_started() {
    counts_what_was_processed_since_it_started("postgres").await;
}
