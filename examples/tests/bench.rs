//! The benchmark, run as users run it but tiny (seconds), on the embedded SQLite and every
//! server the test script started: every backend reports every measure at every
//! concurrency, in the documented JSON shape. No timing targets: those are for the
//! figures of a real run (BENCHMARKS.md), not for a test on a shared machine.

mod support;

use serde_json::Value;
use support::{json_lines, run_example, server_urls};

/// Every measure, with the name of its baseline's figure (`None`: a latency or rate row),
/// and whether only the SQL backends (transactional mode) report it.
const MEASURES: [(&str, Option<&str>, bool); 10] = [
    ("claim_commit", Some("raw"), false),
    ("claim_commit_duplicates", Some("raw"), false),
    ("batch", Some("raw"), false),
    ("tx_claim_vs_insert_alone", Some("insert_alone"), true),
    (
        "tx_claim_vs_two_transactions",
        Some("two_transactions"),
        true,
    ),
    ("tx_inbox_vs_claim_in_tx", Some("claim_in_tx"), true),
    ("tx_inbox_vs_insert_alone", Some("insert_alone"), true),
    ("claim_p50_during_purge", None, false),
    ("claim_p99_during_purge", None, false),
    ("purge_rows_per_s", None, false),
];

const CONCURRENCY: [u64; 2] = [1, 3];
const PURGE_ROWS: u64 = 1500;

/// The backend names the bench reports for a store URL (PostgreSQL: one per durability
/// setting it measures by default, durable then not), and whether it is an SQL one.
fn backends_of(url: &str) -> (&'static [&'static str], bool) {
    match url.split(':').next() {
        Some("sqlite") => (&["sqlite"], true),
        Some("postgres" | "postgresql") => (&["postgres", "postgres-nosync"], true),
        Some("redis+cluster") => (&["redis-cluster"], false),
        Some("redis" | "rediss") => (&["redis"], false),
        _ => panic!("unexpected store url {url}"),
    }
}

fn number(row: &Value, field: &str, out: &str) -> f64 {
    row[field]
        .as_f64()
        .unwrap_or_else(|| panic!("no number {field} in {row}:\n{out}"))
}

#[test]
fn bench_reports_every_measure_for_every_backend_and_concurrency() {
    let tmp = tempfile::tempdir().unwrap();
    let mut stores = vec![format!("sqlite:{}", tmp.path().join("bench.db").display())];
    stores.extend(server_urls());
    let purge_rows = PURGE_ROWS.to_string();
    let concurrency = CONCURRENCY.map(|c| c.to_string()).join(",");
    let mut args: Vec<String> = [
        "--messages",
        "60",
        "--batch-messages",
        "200",
        "--batch",
        "50",
        "--concurrency",
        &concurrency,
        "--purge-rows",
        &purge_rows,
        "--rounds",
        "1",
        "--min-secs",
        "0",
        "--warmup",
        "10",
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

    let mut expected = 0;
    for (backend, sql) in stores.iter().flat_map(|store| {
        let (names, sql) = backends_of(store);
        names.iter().map(move |name| (*name, sql))
    }) {
        for c in CONCURRENCY {
            for (measure, baseline_name, sql_only) in MEASURES {
                if sql_only && !sql {
                    continue;
                }
                expected += 1;
                let found: Vec<&Value> = rows
                    .iter()
                    .filter(|r| {
                        r["backend"] == backend && r["measure"] == measure && r["concurrency"] == c
                    })
                    .collect();
                assert_eq!(found.len(), 1, "{backend} {measure} c={c}:\n{out}");
                check_row(found[0], baseline_name, &out);
            }
        }
    }
    assert_eq!(rows.len(), expected, "unexpected rows:\n{out}");
    // The table is printed too, with a concurrency column.
    assert!(out.contains("raw / baseline"), "{out}");
    assert!(out.contains("tx_claim_vs_two_transactions"), "{out}");
}

/// The fields every row has, and those its kind of measure promises.
fn check_row(row: &Value, baseline_name: Option<&str>, out: &str) {
    let measure = row["measure"].as_str().unwrap();
    for field in ["library", "baseline", "ratio"] {
        let v = number(row, field, out);
        assert!(v.is_finite() && v > 0.0, "{measure} {field} = {v}:\n{out}");
    }
    assert!(row["unit"].is_string(), "{row}");
    assert!(row["setup"].is_string(), "{row}");
    let ratio = number(row, "ratio", out);
    let quotient = number(row, "library", out) / number(row, "baseline", out);
    assert!(
        (ratio - quotient).abs() <= 1e-9 * ratio,
        "{measure}: ratio is not library / baseline: {row}"
    );
    match baseline_name {
        Some(name) => {
            assert_eq!(row["unit"], "msgs/s", "{row}");
            assert_eq!(
                number(row, "library", out),
                number(row, "library_msgs_per_s", out)
            );
            assert_eq!(
                number(row, "baseline", out),
                number(row, &format!("{name}_msgs_per_s"), out),
                "{row}"
            );
            if measure == "claim_commit_duplicates" {
                assert_eq!(row["duplicate_percent"], 30, "{row}");
            }
        }
        None => {
            // The purge removed exactly the prefilled records, with the default options,
            // and claims overlapped it.
            assert_eq!(row["purged"], PURGE_ROWS, "{row}");
            assert!(
                row["purge_options"]
                    .as_str()
                    .is_some_and(|o| o.contains("Paced")),
                "the default purge options are paced: {row}"
            );
            assert!(number(row, "purge_rows_per_s", out) > 0.0, "{row}");
            if measure == "purge_rows_per_s" {
                assert_eq!(row["unit"], "rows/s", "{row}");
                assert_eq!(
                    number(row, "library", out),
                    number(row, "purge_rows_per_s", out)
                );
            } else {
                assert_eq!(row["unit"], "ms", "{row}");
                assert!(number(row, "samples_during", out) >= 1.0, "{row}");
                assert_eq!(number(row, "library", out), number(row, "during_ms", out));
                assert_eq!(number(row, "baseline", out), number(row, "alone_ms", out));
            }
        }
    }
}

#[test]
fn bench_rejects_an_in_memory_store() {
    let out = support::run_example_expect_failure("bench", &["--store", "sqlite::memory:"]);
    assert!(out.contains("needs a backend"), "{out}");
}
