//! The benchmark, run as users run it but tiny (seconds), on the embedded SQLite and every
//! server the test script started: every backend reports every measure at every
//! concurrency, in the documented JSON shape. No timing targets: those are for the
//! figures of a real run (BENCHMARKS.md), not for a test on a shared machine.

use dedup_lab::programs as support;

use serde_json::Value;
use support::{json_lines, run_example, server_urls};

/// Every measure, with the name of its baseline's figure (`None`: a latency or rate row),
/// and whether only the SQL backends (transactional mode) report it.
const MEASURES: [(&str, Option<&str>, bool); 11] = [
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
    ("tx_inbox_vs_hand_written", Some("hand_written"), true),
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
    let stores: Vec<(String, &[&str], bool)> = stores
        .into_iter()
        .map(|url| {
            let (names, sql) = backends_of(&url);
            (url, names, sql)
        })
        .collect();
    bench_reports_every_measure(&stores, PURGE_ROWS, None);
}

/// The stores on a cluster, and the single node each is compared with: a Galera node
/// (`DEDUP_GALERA_URLS`) beside the single MariaDB (`DEDUP_MYSQL_URL`); NATS KV on an R3
/// bucket of the cluster (`DEDUP_NATS_CLUSTER_URLS`) beside an R1 bucket on the single
/// server (`DEDUP_NATS_URL`). A test of their own, so they run beside the others.
#[cfg(all(feature = "mysql", feature = "nats-kv"))]
#[test]
fn bench_reports_every_measure_on_the_clusters_and_their_single_nodes() {
    // The single MariaDB's rows are the first test's; here only the new targets run.
    let stores: Vec<_> = cluster_stores()
        .into_iter()
        .filter(|(_, names, _)| names != &["mysql"])
        .collect();
    if stores.is_empty() {
        return;
    }
    // NATS KV's paced purge reads one record per round trip: few records, and a claim
    // stream that stops soon, keep the test short.
    bench_reports_every_measure(&stores, CLUSTER_PURGE_ROWS, Some("1"));
}

/// Records the purge measure of the cluster test removes.
#[cfg(all(feature = "mysql", feature = "nats-kv"))]
const CLUSTER_PURGE_ROWS: u64 = 100;

/// The stores of the cluster test, as `(url, row names, sql)`; a missing server is
/// skipped with a message (a failure under DEDUP_TEST_STRICT=1).
#[cfg(all(feature = "mysql", feature = "nats-kv"))]
fn cluster_stores() -> Vec<(String, &'static [&'static str], bool)> {
    use dedup_conformance::server_url;
    let mut stores: Vec<(String, &'static [&'static str], bool)> = Vec::new();
    if let Some(url) = server_url("DEDUP_MYSQL_URL") {
        stores.push((url, &["mysql"], true));
    }
    if let Some(urls) = server_url("DEDUP_GALERA_URLS") {
        let first = urls.split(',').next().unwrap().to_owned();
        stores.push((first, &["galera"], true));
    }
    for (var, replicas, names) in [
        ("DEDUP_NATS_URL", 1, &["nats-kv"]),
        ("DEDUP_NATS_CLUSTER_URLS", 3, &["nats-kv-r3"]),
    ] {
        if let Some(servers) = server_url(var) {
            let bucket = format!("dedup_bench_test_r{replicas}");
            let url = dedup_nats_kv::store_url(&servers, &bucket);
            stores.push((format!("{url}&replicas={replicas}"), names, false));
        }
    }
    stores
}

/// Run the bench, tiny, on `stores` (`(url, row names, sql)`) and check that every
/// backend reports every measure at every concurrency, in the documented JSON shape; the
/// purge measure removes `purge_rows` records beside a claim stream that runs
/// `purge_stream_secs` at most (`None`: the default).
fn bench_reports_every_measure(
    stores: &[(String, &[&str], bool)],
    purge_rows: u64,
    purge_stream_secs: Option<&str>,
) {
    let purge_rows_arg = purge_rows.to_string();
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
        &purge_rows_arg,
        "--rounds",
        "1",
        "--min-secs",
        "0",
        "--warmup",
        "10",
        // The per-store measures only: the outbox and broker groups have a test of their
        // own.
        "--only",
        "claim_commit,claim_commit_duplicates,batch,tx,purge",
        "--json",
    ]
    .map(String::from)
    .to_vec();
    if let Some(secs) = purge_stream_secs {
        args.extend(["--purge-stream-secs".to_owned(), secs.to_owned()]);
    }
    for (store, _, _) in stores {
        args.extend(["--store".to_owned(), store.clone()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_example("bench", &args);
    let rows = json_lines(&out);

    let mut expected = 0;
    for (backend, sql) in stores
        .iter()
        .flat_map(|(_, names, sql)| names.iter().map(move |name| (*name, *sql)))
    {
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
                check_row(found[0], baseline_name, purge_rows, &out);
            }
        }
    }
    assert_eq!(rows.len(), expected, "unexpected rows:\n{out}");
    // The table is printed too, with a concurrency column.
    assert!(out.contains("raw / baseline"), "{out}");
    if stores.iter().any(|(_, _, sql)| *sql) {
        assert!(out.contains("tx_claim_vs_two_transactions"), "{out}");
    }
}

/// The counted mode on the clusters and their single nodes: claim+commit of fresh keys
/// one at a time, library and raw, with requests counted through the proxy and the
/// servers' CPU (every node's) read here. A claim and a commit are one statement (NATS:
/// one request) each, as the raw insert and update (MySQL) or create and update (NATS KV)
/// are. Round trips may exceed two per message by a little: a connection's first calls
/// prepare statements, and the NATS KV store samples the server's clock every 5 seconds.
/// 400 messages keep a connection's set-up (about 10 round trips) under 0.03 per message:
/// with 100, one connection opened mid-run put MySQL at 2.1.
#[cfg(all(feature = "mysql", feature = "nats-kv", feature = "counted"))]
#[test]
fn bench_counts_claim_commit_on_the_clusters_and_their_single_nodes() {
    let stores = cluster_stores();
    if stores.is_empty() {
        return;
    }
    let mut args: Vec<String> = [
        "--counted",
        "--only",
        "claim_commit",
        "--concurrency",
        "1",
        "--messages",
        "400",
        "--warmup",
        "10",
        "--json",
    ]
    .map(String::from)
    .to_vec();
    for (store, _, _) in &stores {
        args.extend(["--store".to_owned(), store.clone()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_example("bench", &args);
    let rows = json_lines(&out);
    let backends: Vec<&str> = stores
        .iter()
        .flat_map(|(_, names, _)| *names)
        .copied()
        .collect();
    for backend in &backends {
        for side in ["library", "raw"] {
            let found: Vec<&Value> = rows
                .iter()
                .filter(|r| r["backend"] == *backend && r["side"] == side)
                .collect();
            assert_eq!(found.len(), 1, "{backend} {side}:\n{out}");
            let row = found[0];
            assert_eq!(row["measure"], "claim_commit", "{row}");
            assert_eq!(row["concurrency"], 1, "{row}");
            assert_eq!(row["messages"], 400, "{row}");
            let rt = number(row, "round_trips", &out);
            assert!(
                (2.0..2.1).contains(&rt),
                "{backend} {side} round trips: {row}"
            );
            let statements = number(row, "client_statements", &out);
            // A pool may open a connection mid-run (its setup statements count): SQL in a
            // range; a NATS client has nothing but the requests.
            match side {
                "raw" if backend.starts_with("nats-kv") => {
                    assert_eq!(statements, 2.0, "{backend} raw requests: {row}")
                }
                _ => assert!(
                    (2.0..2.1).contains(&statements),
                    "{backend} {side} statements: {row}"
                ),
            }
            // Every node's CPU is read (in clock ticks: a short run may spend none).
            assert!(number(row, "server_cpu_us", &out) >= 0.0, "{row}");
            assert!(number(row, "client_cpu_us", &out) > 0.0, "{row}");
            if side == "library" {
                let ratio = number(row, "cpu_ratio", &out);
                assert!(ratio.is_finite() && ratio > 0.0, "{row}");
            }
        }
    }
    assert_eq!(rows.len(), 2 * backends.len(), "unexpected rows:\n{out}");
    // Galera's CPU is the three nodes'.
    if backends.contains(&"galera") {
        assert!(out.contains("the 3 Galera nodes' mariadbd"), "{out}");
    }
}

/// The fields every row has, and those its kind of measure promises.
fn check_row(row: &Value, baseline_name: Option<&str>, purge_rows: u64, out: &str) {
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
            assert_eq!(row["purged"], purge_rows, "{row}");
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

/// The outbox and broker groups, tiny: every row for every server the environment names
/// (SQLite always), with the figures each promises.
#[cfg(all(
    feature = "postgres",
    feature = "sqlite",
    feature = "rabbitmq",
    feature = "redis",
    feature = "nats",
    feature = "kafka"
))]
#[test]
fn bench_reports_the_outbox_and_broker_groups() {
    let url = |name: &str| {
        let url = dedup_conformance::server_url(name);
        if url.is_none() {
            eprintln!("SKIPPED the rows needing {name}: not set");
        }
        url.is_some()
    };
    let (postgres, amqp, redis, nats) = (
        url("DEDUP_POSTGRES_URL"),
        url("DEDUP_AMQP_URL"),
        url("DEDUP_REDIS_URL"),
        url("DEDUP_NATS_URL"),
    );
    let (mysql, pubsub) = (url("DEDUP_MYSQL_URL"), url("DEDUP_PUBSUB_EMULATOR_HOST"));
    let kafka = url("DEDUP_KAFKA_BROKERS");
    let concurrency = CONCURRENCY.map(|c| c.to_string()).join(",");
    let out = run_example(
        "bench",
        &[
            "--only",
            "outbox,brokers",
            "--messages",
            "40",
            "--batch-messages",
            "150",
            "--concurrency",
            &concurrency,
            "--rounds",
            "1",
            "--min-secs",
            "0",
            "--warmup",
            "5",
            "--json",
        ],
    );
    let rows = json_lines(&out);
    let mut expected: Vec<(&str, &str, u64)> = Vec::new();
    for c in CONCURRENCY {
        expected.push(("sqlite", "outbox_enqueue_vs_insert_alone", c));
        if postgres {
            expected.push(("postgres", "outbox_enqueue_vs_insert_alone", c));
        }
        if mysql {
            expected.push(("mysql", "outbox_enqueue_vs_insert_alone", c));
        }
        for (broker, there) in [
            ("rabbitmq", amqp),
            ("redis-streams", redis),
            ("nats", nats),
            ("kafka", kafka),
            ("pubsub", pubsub),
        ] {
            if there {
                expected.push((broker, "consumer_adapter_vs_inbox_loop", c));
                expected.push((broker, "consumer_adapter_vs_raw", c));
            }
        }
    }
    if postgres && amqp {
        for measure in [
            "relay_vs_raw_publish",
            "commit_to_publish_p50",
            "commit_to_publish_p99",
        ] {
            expected.push(("postgres+rabbitmq", measure, 1));
        }
    }
    for &(backend, measure, c) in &expected {
        let found: Vec<&Value> = rows
            .iter()
            .filter(|r| r["backend"] == backend && r["measure"] == measure && r["concurrency"] == c)
            .collect();
        assert_eq!(found.len(), 1, "{backend} {measure} c={c}:\n{out}");
        let row = found[0];
        for field in ["library", "baseline", "ratio"] {
            let v = number(row, field, &out);
            assert!(v.is_finite() && v > 0.0, "{measure} {field} = {v}:\n{out}");
        }
        let quotient = number(row, "library", &out) / number(row, "baseline", &out);
        assert!(
            (number(row, "ratio", &out) - quotient).abs() <= 1e-9 * quotient,
            "{row}"
        );
        assert!(row["setup"].is_string(), "{row}");
        match measure {
            "commit_to_publish_p50" | "commit_to_publish_p99" => {
                assert_eq!(row["unit"], "ms", "{row}");
                // Every committed message was published by each relay and received.
                assert_eq!(row["notify_sent"], row["messages"], "{row}");
                assert_eq!(row["polling_sent"], row["messages"], "{row}");
                // Issue 55's measure: 1 000 commits/s, a p99 target of 10 ms.
                assert_eq!(row["commit_every_ms"], 1, "{row}");
                assert_eq!(number(row, "target_p99_ms", &out), 10.0, "{row}");
                assert!(number(row, "notify_commits_per_s", &out) > 0.0, "{row}");
            }
            "relay_vs_raw_publish" => {
                assert_eq!(row["messages"], 150, "{row}");
                // 150 rows in batches of 100: two rounds.
                assert_eq!(row["relay_rounds"], 2, "{row}");
            }
            "consumer_adapter_vs_inbox_loop" => {
                assert_eq!(row["store"], "MemoryStore", "{row}");
                assert_eq!(
                    number(row, "library", &out),
                    number(row, "library_msgs_per_s", &out)
                );
                assert_eq!(
                    number(row, "baseline", &out),
                    number(row, "inbox_loop_msgs_per_s", &out)
                );
            }
            "consumer_adapter_vs_raw" => {
                assert_eq!(
                    number(row, "baseline", &out),
                    number(row, "raw_msgs_per_s", &out)
                );
            }
            _ => assert_eq!(row["unit"], "msgs/s", "{row}"),
        }
    }
    assert_eq!(rows.len(), expected.len(), "unexpected rows:\n{out}");
}

#[test]
fn bench_rejects_an_in_memory_store() {
    let out = support::run_example_expect_failure("bench", &["--store", "sqlite::memory:"]);
    assert!(out.contains("needs a backend"), "{out}");
}
