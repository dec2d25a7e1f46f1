//! Time the console's overview (`GET /api/overview`) on a store, and the two aggregate
//! reads it is made of (`Admin::consumers`, `Admin::stats`).
//!
//! `cargo run --release -p dedup-console --example overview_timing -- URL seed` writes four
//! template records per consumer (processed, failed, dead-lettered, in flight) for two
//! consumers; multiply them with SQL to reach the size to measure (see the console's
//! README), then `... -- URL` prints the timings (median of 7 runs after one warm-up) and
//! where the counts came from. `... -- URL enable` / `disable` turns the store's kept
//! counts on or off (printing how long that took); `... -- URL loop N` times N claim+commit
//! pairs of new keys, one after the other (consumer `timing-loop`), to see what kept counts
//! cost a consumer.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use dedup::inbox::Failure;
use dedup::store::{ClaimOptions, Verdict};
use dedup::{DedupStore, Key};
use dedup_console::{Console, ConsoleConfig};
use tower::ServiceExt;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn time<F, Fut>(mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    f().await;
    let mut runs = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        f().await;
        runs.push(t.elapsed());
    }
    median(runs)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args.next().expect("a store URL");
    let admin = dedup::open_admin(&url).await.expect("open");
    let mode = args.next();
    match mode.as_deref() {
        Some("enable" | "disable") => {
            let t = Instant::now();
            let changed = match mode.as_deref() {
                Some("enable") => admin.enable_counts().await,
                _ => admin.disable_counts().await,
            }
            .expect("kept counts");
            println!(
                "{}: changed {changed} in {:?}",
                mode.unwrap_or_default(),
                t.elapsed()
            );
            return;
        }
        Some("loop") => {
            let n: usize = args.next().and_then(|n| n.parse().ok()).expect("loop N");
            let run = uuid::Uuid::new_v4().simple().to_string();
            let t = Instant::now();
            for i in 0..n {
                let key = Key::new("timing-loop", format!("{run}-{i}")).unwrap();
                let lease = admin
                    .claim(&key, &ClaimOptions::lease(Duration::from_secs(60)))
                    .await
                    .unwrap()
                    .into_lease()
                    .expect("a new key");
                admin.commit(&lease, Some(b"ok")).await.unwrap();
            }
            let source = admin.count_source().await.unwrap().as_str();
            println!(
                "{n} claim+commit pairs (counts {source}): {:?} per pair",
                t.elapsed() / n as u32
            );
            return;
        }
        _ => {}
    }
    if mode.as_deref() == Some("seed") {
        let now = admin.now().await.unwrap();
        let cause = Failure::new("handler", vec!["connection refused".into()], 1, now, None);
        for consumer in ["billing", "shipping"] {
            for (id, outcome) in [
                ("processed", Some(b"ok".to_vec())),
                ("failed", Some(Verdict::failed(&cause))),
                ("dead", Some(Verdict::dead_letter(3, Some(&cause)))),
                ("in-flight", None),
            ] {
                let lease = admin
                    .claim(
                        &Key::new(consumer, id).unwrap(),
                        &ClaimOptions::lease(Duration::from_secs(86_400)),
                    )
                    .await
                    .unwrap()
                    .into_lease()
                    .expect("a fresh store");
                if let Some(o) = outcome {
                    admin.commit(&lease, Some(&o)).await.unwrap();
                }
            }
        }
        println!("seeded 8 template records");
        return;
    }
    let total: u64 = admin
        .consumers()
        .await
        .unwrap()
        .iter()
        .map(|c| c.counts.total())
        .sum();
    let consumers = time(|| async {
        admin.consumers().await.unwrap();
    })
    .await;
    let stats = time(|| async {
        admin.stats(0).await.unwrap();
    })
    .await;
    let app = Console::new(admin.clone(), &url, ConsoleConfig::default())
        .unwrap()
        .router();
    let overview = time(|| async {
        let resp = app
            .clone()
            .oneshot(Request::get("/api/overview").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert!(resp.status().is_success());
    })
    .await;
    let resp = app
        .clone()
        .oneshot(Request::get("/api/overview").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let page: serde_json::Value = serde_json::from_slice(&body).unwrap();
    if let Some(hint) = page["counts_hint"].as_str() {
        println!("the overview advises: {hint}");
    }
    let source = admin.count_source().await.unwrap().as_str();
    println!(
        "{total} records, counts {source}: overview {overview:?} (consumers {consumers:?}, \
         stats {stats:?})"
    );
}
