//! The main demo, run as a user runs it, with its printed table checked.

use dedup_lab::programs as support;

use support::{json_lines, run_example};

#[test]
fn demo_naive_doubles_some_charges_and_dedup_none_on_the_default_sqlite_store() {
    let out = run_example("demo", &["--messages", "400", "--json"]);
    let rows = json_lines(&out);
    let naive = rows
        .iter()
        .find(|r| r["consumer"] == "naive")
        .expect("naive row");
    let dedup = rows
        .iter()
        .find(|r| r["consumer"] == "dedup")
        .expect("dedup row");
    assert!(
        out.contains("duplicates suppressed"),
        "the table is printed:\n{out}"
    );
    assert!(
        naive["doubled"].as_u64().unwrap() > 0,
        "naive must double some charges:\n{out}"
    );
    assert_eq!(dedup["doubled"], 0, "{out}");
    assert_eq!(dedup["lost"], 0, "{out}");
    assert_eq!(dedup["side_effects"], 400, "one charge per message:\n{out}");
    assert!(
        dedup["duplicates_suppressed"].as_u64().unwrap() > 0,
        "{out}"
    );
    assert!(naive["deliveries"].as_u64() > Some(400), "{out}");
}

#[test]
fn demo_runs_on_every_configured_store() {
    let mut urls = vec!["memory:".to_string(), "sqlite::memory:".to_string()];
    urls.extend(support::server_urls());
    for url in urls {
        let out = run_example(
            "demo",
            &[
                "--store",
                &url,
                "--messages",
                "200",
                "--concurrency",
                "4",
                "--json",
            ],
        );
        let rows = json_lines(&out);
        let dedup = rows
            .iter()
            .find(|r| r["consumer"] == "dedup")
            .expect("dedup row");
        assert_eq!(
            (dedup["doubled"].as_u64(), dedup["lost"].as_u64()),
            (Some(0), Some(0)),
            "{url}:\n{out}"
        );
        assert_eq!(dedup["side_effects"], 200, "{url}:\n{out}");
    }
}

#[test]
fn demo_rejects_bad_flags_with_a_clear_message() {
    let out = support::run_example_expect_failure("demo", &["--crash-rate", "2"]);
    assert!(
        out.contains("--crash-rate must be between 0 and 1"),
        "{out}"
    );
    let out = support::run_example_expect_failure("demo", &["--store", "oracle://x"]);
    assert!(out.contains("unknown scheme"), "{out}");
}

/// A store nobody listens at: within seconds, one `error:` line, the cause in plain words,
/// no `Debug` dump, no password, a non-zero exit.
#[test]
fn demo_with_an_unreachable_store_fails_fast_in_plain_words() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for url in [
        format!("postgres://app:hunter2@127.0.0.1:{port}/x"),
        format!("redis://:hunter2@127.0.0.1:{port}/"),
        "sqlite:/nonexistent-dedup-folder/x.db".to_owned(),
    ] {
        let exe = env!("CARGO_BIN_EXE_demo");
        let started = std::time::Instant::now();
        let output = std::process::Command::new(exe)
            .args(["--store", &url])
            .output()
            .expect("spawn demo");
        let took = started.elapsed();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success(),
            "{url}: exit status {:?}",
            output.status
        );
        assert!(
            took < std::time::Duration::from_secs(5),
            "{url}: took {took:?}"
        );
        let errors = stderr.lines().filter(|l| l.starts_with("error:")).count();
        assert_eq!(errors, 1, "{url}: one error line:\n{stderr}");
        assert!(stderr.contains("caused by:"), "{url}: a cause:\n{stderr}");
        assert!(
            stderr.contains("nothing listens at") || stderr.contains("does not exist"),
            "{url}: a hint:\n{stderr}"
        );
        assert!(
            !stderr.contains("Backend {"),
            "{url}: no Debug dump:\n{stderr}"
        );
        assert!(!stderr.contains("hunter2"), "{url}: no password:\n{stderr}");
    }
}
