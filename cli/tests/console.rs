//! `dedup console`: the binary serves the console over a real SQLite store, read-only by
//! default, and refuses writes.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use dedup_core::{ClaimOptions, DedupStore, Key};
use dedup_sqlite::SqliteStore;
use support::{get, http};

/// The console process, killed when dropped.
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `dedup console` with `args`; its address and the lines it printed first.
fn start(args: &[&str]) -> (Served, String, Vec<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dedup"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start dedup console");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines.next().expect("a line").expect("text");
    let at = first.find("http://").expect("the address") + 7;
    let addr = first[at..at + first[at..].find('/').unwrap()].to_owned();
    let mut out = vec![first];
    if args.contains(&"--allow-writes") && !args.contains(&"--token") {
        out.push(lines.next().expect("the token line").expect("text"));
    }
    (Served(child), addr, out)
}

/// A SQLite store in `dir` holding `billing/m-1` committed with `outcome`; its URL.
async fn store_with(dir: &tempfile::TempDir, outcome: &[u8]) -> String {
    let path = dir.path().join("c.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let lease = store
        .claim(
            &Key::new("billing", "m-1").unwrap(),
            &ClaimOptions::lease(Duration::from_secs(30)),
        )
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    store.commit(&lease, Some(outcome)).await.unwrap();
    format!("sqlite:{}", path.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_serves_the_store_and_refuses_writes_when_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let url = store_with(&dir, b"ok").await;

    let (_served, addr, lines) = start(&["--store", &url, "console", "--listen", "127.0.0.1:0"]);
    assert!(lines[0].contains("read-only"), "{lines:?}");
    let (status, body) = http(
        &addr,
        &format!("GET /api/overview HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("\"consumer\":\"billing\",\"processed\":1"),
        "{body}"
    );
    let form = "csrf=x";
    let (status, _) = http(
        &addr,
        &format!(
            "POST /act/purge HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
            form.len()
        ),
    );
    assert_eq!(status, 403);

    // With writes allowed and no token given, one is generated and printed.
    let (_served, _, lines) = start(&[
        "--store",
        &url,
        "console",
        "--listen",
        "127.0.0.1:0",
        "--allow-writes",
    ]);
    assert!(lines[0].contains("writes allowed"), "{lines:?}");
    assert!(
        lines[1].starts_with("token (sign in with it at http://"),
        "{lines:?}"
    );
}

/// `--dead-letters CONSUMER=URL`: a malformed one is a usage error naming it (its password
/// hidden), before anything is served; a well-formed one is where the console reads the
/// consumer's dead letters (nothing listens there: the key's JSON says so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_reads_each_consumers_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let url = store_with(&dir, &dedup_core::Verdict::dead_letter(3, None)).await;

    let out = Command::new(env!("CARGO_BIN_EXE_dedup"))
        .args([
            "--store",
            &url,
            "console",
            "--dead-letters",
            "redis://u:pw@h",
        ])
        .output()
        .expect("run dedup console");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("invalid --dead-letters"), "{stderr}");
    assert!(!stderr.contains("pw"), "{stderr}");

    let dead_letters = "billing=redis://127.0.0.1:1/?stream=orders";
    let (_served, addr, _) = start(&[
        "--store",
        &url,
        "console",
        "--listen",
        "127.0.0.1:0",
        "--dead-letters",
        dead_letters,
    ]);
    let (status, body) = get(&addr, "/api/key?consumer=billing&id=m-1");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"state\":\"unreachable\""), "{body}");
    assert!(body.contains("redis://127.0.0.1:1"), "{body}");
}
