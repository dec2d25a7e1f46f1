//! The benchmark, run as users run it (small numbers), on the embedded SQLite and every
//! server the test script started: every backend reports every measure, with sane ratios.

mod support;

use support::{json_lines, run_example, server_urls};

const MEASURES: [&str; 4] = [
    "claim_commit",
    "batch",
    "claim_p50_during_purge",
    "claim_p99_during_purge",
];

/// The backend name the bench reports for a store URL.
fn backend_of(url: &str) -> &'static str {
    match url.split(':').next() {
        Some("sqlite") => "sqlite",
        Some("postgres" | "postgresql") => "postgres",
        Some("redis+cluster") => "redis-cluster",
        Some("redis" | "rediss") => "redis",
        _ => panic!("unexpected store url {url}"),
    }
}

#[test]
fn bench_reports_every_measure_for_every_backend_with_sane_ratios() {
    let tmp = tempfile::tempdir().unwrap();
    let mut stores = vec![format!("sqlite:{}", tmp.path().join("bench.db").display())];
    stores.extend(server_urls());
    let purge_rows = 2000;
    let purge_rows_arg = purge_rows.to_string();
    let mut args: Vec<String> = [
        "--messages",
        "200",
        "--batch-messages",
        "1000",
        "--batch",
        "50",
        "--concurrency",
        "4",
        "--purge-rows",
        &purge_rows_arg,
        "--purge-batch",
        "500",
        "--rounds",
        "1",
        "--min-secs",
        "0",
        "--warmup",
        "20",
        "--json",
    ]
    .map(String::from)
    .to_vec();
    for store in &stores {
        args.extend(["--store".to_owned(), store.clone()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_example("bench", &args);
    let rows = json_lines(&out);
    assert_eq!(rows.len(), stores.len() * MEASURES.len(), "{out}");

    for store in &stores {
        let backend = backend_of(store);
        for measure in MEASURES {
            let row = rows
                .iter()
                .find(|r| r["backend"] == backend && r["measure"] == measure)
                .unwrap_or_else(|| panic!("no {measure} row for {backend}:\n{out}"));
            let figure = |field: &str| {
                row[field]
                    .as_f64()
                    .unwrap_or_else(|| panic!("{backend} {measure}: no number {field}:\n{out}"))
            };
            for field in ["library", "baseline", "ratio"] {
                let v = figure(field);
                assert!(
                    v.is_finite() && v > 0.0,
                    "{backend} {measure} {field} = {v}"
                );
            }
            let ratio = figure("ratio");
            assert!(
                (ratio - figure("library") / figure("baseline")).abs() <= 1e-9 * ratio,
                "{backend} {measure}: ratio is not library / baseline:\n{out}"
            );
            if measure == "claim_commit" || measure == "batch" {
                // The library does more than the bare statements, but never absurdly more.
                assert!(
                    ratio > 0.05,
                    "{backend} {measure}: library at {ratio} of raw:\n{out}"
                );
                assert_eq!(figure("library"), figure("library_msgs_per_s"));
                assert_eq!(figure("baseline"), figure("raw_msgs_per_s"));
            } else {
                // The purge removed exactly the prefilled records, and claims overlapped it.
                assert_eq!(row["purged"], purge_rows, "{backend} {measure}:\n{out}");
                assert!(figure("samples_during") >= 1.0, "{out}");
                assert_eq!(figure("library"), figure("during_ms"));
                assert_eq!(figure("baseline"), figure("alone_ms"));
            }
        }
    }
    // The table is printed too.
    assert!(out.contains("raw / baseline"), "{out}");
}

#[test]
fn bench_rejects_an_in_memory_store() {
    let out = support::run_example_expect_failure("bench", &["--store", "sqlite::memory:"]);
    assert!(out.contains("needs a backend"), "{out}");
}
