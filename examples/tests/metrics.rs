//! The `metrics` program serves Prometheus metrics over HTTP on a loopback port: scraped
//! here, every dedup counter of its scripted workload has exactly the expected value.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};

/// Kills the program when the test ends, passed or not.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET /metrics` over plain HTTP/1.1; the body.
fn scrape(port: u16) -> String {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("connect to the exporter");
    write!(
        conn,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

/// The sum of the samples of `name` whose labels contain every `label="value"` of `labels`.
fn sample(body: &str, name: &str, labels: &[&str]) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            metric == name && labels.iter().all(|want| rest.contains(want))
        })
        .map(|(_, value)| value.parse::<f64>().unwrap())
        .sum()
}

#[test]
fn the_metrics_program_serves_every_counter_of_its_workload_over_http() {
    let port = free_port();
    let exe = env!("CARGO_BIN_EXE_metrics");
    let listen = format!("127.0.0.1:{port}");
    let mut child = Command::new(exe)
        .args([
            "--listen",
            &listen,
            "--store",
            "sqlite::memory:",
            "--serve-for",
            "120",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the metrics program");
    let stdout = child.stdout.take().unwrap();
    let _running = Running(child);
    let mut printed = String::new();
    let summary = BufReader::new(stdout)
        .lines()
        .map(|l| l.unwrap())
        .inspect(|l| printed.push_str(&format!("{l}\n")))
        .find_map(|l| l.strip_prefix("JSON ").map(str::to_owned))
        .unwrap_or_else(|| panic!("no summary line; it printed:\n{printed}"));
    let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();
    assert_eq!(summary["takeovers"], 3, "{summary}");

    let body = scrape(port);
    let claims = |outcome: &str| {
        sample(
            &body,
            "dedup_claims_total",
            &["backend=\"sqlite\"", &format!("outcome=\"{outcome}\"")],
        )
    };
    // 20 orders + the crashed order's first claim + the poison's and the declined card's
    // first attempts.
    assert_eq!(claims("acquired"), 23.0, "{body}");
    // The crashed order's redelivery, and the poison's attempts 2 and 3.
    assert_eq!(claims("takeover"), 3.0, "{body}");
    // 5 redelivered orders, the dead-lettered poison redelivered, the stored failure replayed.
    assert_eq!(claims("completed"), 7.0, "{body}");
    assert_eq!(claims("in_flight"), 0.0, "{body}");
    // 20 orders, the crashed order, the dead letter, the stored failure.
    assert_eq!(sample(&body, "dedup_commits_total", &[]), 23.0, "{body}");
    assert_eq!(sample(&body, "dedup_releases_total", &[]), 2.0, "{body}");
    assert_eq!(sample(&body, "dedup_lease_lost_total", &[]), 0.0, "{body}");
    assert_eq!(
        sample(&body, "dedup_dead_letters_total", &["replay=\"false\""]),
        1.0
    );
    assert_eq!(
        sample(&body, "dedup_dead_letters_total", &["replay=\"true\""]),
        1.0
    );
    assert_eq!(sample(&body, "dedup_stored_failures_total", &[]), 1.0);
    // Handler runs: 20 orders, the crashed order's redelivery, 2 poison attempts, 1 decline.
    assert_eq!(
        sample(&body, "dedup_handler_duration_seconds_count", &[]),
        24.0,
        "{body}"
    );
    assert_eq!(
        sample(
            &body,
            "dedup_operation_duration_seconds_count",
            &["op=\"claim\""]
        ),
        33.0,
        "{body}"
    );
    assert!(
        body.contains("dedup_operation_duration_seconds_bucket{"),
        "histograms have buckets"
    );
}
