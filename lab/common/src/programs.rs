//! The integration tests' helpers: run a program of the package under test, read the
//! `JSON {...}` lines it printed, and find the test servers.

use std::process::Command;

/// Run example binary `name` with `args`; panic with its output unless it succeeds.
pub fn run_example(name: &str, args: &[&str]) -> String {
    let (ok, out) = run(name, args);
    assert!(ok, "{name} {args:?} failed:\n{out}");
    out
}

/// Run example binary `name`, expecting it to fail; its output.
pub fn run_example_expect_failure(name: &str, args: &[&str]) -> String {
    let (ok, out) = run(name, args);
    assert!(!ok, "{name} {args:?} should have failed:\n{out}");
    out
}

fn run(name: &str, args: &[&str]) -> (bool, String) {
    let exe = std::env::var(format!("CARGO_BIN_EXE_{name}"))
        .unwrap_or_else(|_| panic!("no binary {name}"));
    let output = Command::new(exe)
        .args(args)
        .output()
        .expect("spawn example");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// The `JSON {...}` lines an example printed, parsed.
pub fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .filter_map(|l| l.strip_prefix("JSON "))
        .map(|l| serde_json::from_str(l).expect("valid JSON line"))
        .collect()
}

/// Store URLs of the servers the test script started (PostgreSQL, Redis, Redis Cluster).
/// Missing ones are skipped with a message, or fail the test under DEDUP_TEST_STRICT=1.
pub fn server_urls() -> Vec<String> {
    let mut urls = Vec::new();
    if let Some(u) = dedup_conformance::server_url("DEDUP_POSTGRES_URL") {
        urls.push(u);
    } else {
        eprintln!("SKIPPED postgres: DEDUP_POSTGRES_URL not set");
    }
    if let Some(u) = dedup_conformance::server_url("DEDUP_REDIS_URL") {
        urls.push(u);
    } else {
        eprintln!("SKIPPED redis: DEDUP_REDIS_URL not set");
    }
    if let Some(u) = dedup_conformance::server_url("DEDUP_REDIS_CLUSTER_URLS") {
        urls.push(dedup_redis::cluster_url(&u));
    } else {
        eprintln!("SKIPPED redis cluster: DEDUP_REDIS_CLUSTER_URLS not set");
    }
    urls
}
