//! End to end: the built `dedup` binary against real stores (SQLite, PostgreSQL, Redis,
//! Redis Cluster), with records written through the library. One scenario, run per backend.
//!
//! Old records are written by a library store whose injected clock stands two days in the
//! past; the others on the store's own clock. `purge --older-than 1d` must then remove
//! exactly the old ones.

use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dedup_conformance::server_url;
use dedup_core::{Claim, ClaimOptions, Clock, DedupStore, Key, Lease, ManualClock, SystemClock};
use dedup_mysql::{MySqlConfig, MySqlStore, SqlSettings};
use dedup_nats_kv::{NatsKvConfig, NatsKvStore};
use dedup_postgres::{PostgresConfig, PostgresStore};
use dedup_redis::{RedisConfig, RedisStore};
use dedup_sqlite::{SqliteConfig, SqliteStore};
use serde_json::Value;

/// Which backend a scenario runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
    MySql,
    Redis,
    RedisCluster,
    NatsKv,
}

/// A store the scenario drives: its URL and name for the binary, and library handles.
struct Target {
    backend: Backend,
    /// `--store` and `--table` / `--prefix` for the binary.
    args: Vec<String>,
    /// The server URL(s) for the library.
    url: String,
    /// The unique table or key prefix.
    name: String,
    _dir: Option<tempfile::TempDir>,
}

/// The NATS KV bucket the tests share (R3 on the cluster); each test has its own prefix.
const NATS_KV_BUCKET: &str = "dedup_tests";

/// A table / prefix name no other test run uses.
fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    format!("{prefix}_{}_{}", std::process::id(), nanos % 1_000_000_000)
}

impl Target {
    fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("cli.db").display().to_string();
        Target {
            backend: Backend::Sqlite,
            args: vec!["--store".into(), format!("sqlite:{path}")],
            url: path,
            name: "dedup_inbox".into(),
            _dir: Some(dir),
        }
    }

    fn postgres() -> Option<Self> {
        let url = server_url("DEDUP_POSTGRES_URL")?;
        let name = unique("cli");
        Some(Target {
            backend: Backend::Postgres,
            args: vec![
                "--store".into(),
                url.clone(),
                "--table".into(),
                name.clone(),
            ],
            url,
            name,
            _dir: None,
        })
    }

    fn mysql() -> Option<Self> {
        let url = server_url("DEDUP_MYSQL_URL")?;
        let name = unique("cli");
        Some(Target {
            backend: Backend::MySql,
            args: vec![
                "--store".into(),
                url.clone(),
                "--table".into(),
                name.clone(),
            ],
            url,
            name,
            _dir: None,
        })
    }

    fn redis(backend: Backend) -> Option<Self> {
        let (store, url) = match backend {
            Backend::Redis => {
                let url = server_url("DEDUP_REDIS_URL")?;
                (url.clone(), url)
            }
            _ => {
                let urls = server_url("DEDUP_REDIS_CLUSTER_URLS")?;
                (dedup::redis::cluster_url(&urls), urls)
            }
        };
        let name = format!("{}:", unique("cli"));
        Some(Target {
            backend,
            args: vec!["--store".into(), store, "--prefix".into(), name.clone()],
            url,
            name,
            _dir: None,
        })
    }

    /// A prefix of the R3 bucket `dedup_tests` on the NATS cluster, the bucket the NATS KV
    /// tests share.
    fn nats_kv() -> Option<Self> {
        let urls = server_url("DEDUP_NATS_CLUSTER_URLS")?;
        let name = unique("cli");
        let store = format!(
            "{}&replicas=3",
            dedup_nats_kv::store_url(&urls, NATS_KV_BUCKET)
        );
        Some(Target {
            backend: Backend::NatsKv,
            args: vec!["--store".into(), store, "--prefix".into(), name.clone()],
            url: urls,
            name,
            _dir: None,
        })
    }

    /// A library store on the same records, on `clock` (`None`: the store's own).
    async fn library(&self, clock: Option<Arc<dyn Clock>>) -> Arc<dyn DedupStore> {
        match self.backend {
            Backend::Sqlite => Arc::new(
                SqliteStore::open_with(
                    &self.url,
                    SqliteConfig {
                        clock,
                        ..SqliteConfig::default()
                    },
                )
                .await
                .expect("open sqlite"),
            ),
            Backend::Postgres => Arc::new(
                PostgresStore::connect_with(
                    &self.url,
                    PostgresConfig {
                        sql: SqlSettings {
                            table: self.name.clone(),
                            clock,
                            max_connections: 2,
                            ..Default::default()
                        },
                        ..PostgresConfig::default()
                    },
                )
                .await
                .expect("connect postgres"),
            ),
            Backend::MySql => Arc::new(
                MySqlStore::connect_with(
                    &self.url,
                    MySqlConfig::from(SqlSettings {
                        table: self.name.clone(),
                        clock,
                        max_connections: 2,
                        ..Default::default()
                    }),
                )
                .await
                .expect("connect mysql"),
            ),
            Backend::Redis | Backend::RedisCluster => {
                let config = RedisConfig {
                    prefix: self.name.clone(),
                    clock,
                    ..RedisConfig::default()
                };
                Arc::new(
                    if self.backend == Backend::Redis {
                        RedisStore::connect_with(&self.url, config).await
                    } else {
                        let urls: Vec<String> =
                            self.url.split(',').map(|u| u.trim().to_owned()).collect();
                        RedisStore::connect_cluster(&urls, config).await
                    }
                    .expect("connect redis"),
                )
            }
            Backend::NatsKv => {
                let servers: Vec<String> = self
                    .url
                    .split(',')
                    .map(|u| u.trim().to_owned())
                    .filter(|u| !u.is_empty())
                    .collect();
                let config = NatsKvConfig {
                    bucket: NATS_KV_BUCKET.into(),
                    prefix: self.name.clone(),
                    replicas: Some(3),
                    // Far longer than the scenario's clock moves: its records stay.
                    retention: Duration::from_secs(30 * 24 * 3600),
                    clock,
                    ..NatsKvConfig::default()
                };
                Arc::new(
                    NatsKvStore::connect(&servers, config)
                        .await
                        .expect("connect nats-kv"),
                )
            }
        }
    }

    /// Run `dedup <args> <store args>`.
    fn dedup(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_dedup"))
            .args(args)
            .args(&self.args)
            .env_remove("DEDUP_STORE_URL")
            .output()
            .expect("run dedup")
    }

    /// Run it; it must exit with `code`.
    fn expect(&self, code: i32, args: &[&str]) -> Output {
        let output = self.dedup(args);
        assert_eq!(
            output.status.code(),
            Some(code),
            "{:?} dedup {args:?}: stdout {} stderr {}",
            self.backend,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    /// Run it with `--json`; it must succeed; its output parsed.
    fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.push("--json");
        let output = self.expect(0, &args);
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "dedup {args:?} printed no JSON ({e}): {}",
                String::from_utf8_lossy(&output.stdout)
            )
        })
    }
}

fn key(id: &str) -> Key {
    Key::new("billing", id).expect("key")
}

async fn acquire(store: &dyn DedupStore, id: &str, lease: Duration) -> Lease {
    match store.claim(&key(id), &ClaimOptions::lease(lease)).await {
        Ok(Claim::Acquired(lease)) => lease,
        other => panic!("claim of {id}: {other:?}"),
    }
}

fn ids(list: &Value) -> Vec<&str> {
    list["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["message_id"].as_str().expect("message_id"))
        .collect()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The scenario every backend runs.
async fn scenario(t: Target) {
    let started = std::time::Instant::now();
    let wrong = t.dedup(&["purge", "--older-than", "1w"]);
    assert_eq!(
        wrong.status.code(),
        Some(2),
        "a bad duration is a usage error"
    );
    assert!(
        stderr(&wrong).contains("error: invalid --older-than"),
        "{}",
        stderr(&wrong)
    );
    assert!(stderr(&wrong).contains("caused by:") && stderr(&wrong).contains("hint:"));
    if t.backend == Backend::Sqlite {
        t.expect(3, &["stats"]); // no database file before migrate
    }
    let migrated = t.json(&["migrate"]);
    assert_eq!(migrated["migrated"], true);
    t.expect(0, &["migrate"]); // again: a no-op

    // Two days ago: two completed records (one with a binary outcome) and a lease that ran out.
    let past = Arc::new(ManualClock::new(
        SystemClock
            .now()
            .saturating_sub(Duration::from_secs(2 * 86_400)),
    ));
    let old = t.library(Some(past)).await;
    let lease = acquire(&*old, "old-1", Duration::from_secs(30)).await;
    old.commit(&lease, Some(b"ok")).await.expect("commit");
    let lease = acquire(&*old, "old-2", Duration::from_secs(30)).await;
    old.commit(&lease, Some(&[0xff, 0x00]))
        .await
        .expect("commit");
    acquire(&*old, "old-stuck", Duration::from_secs(30)).await;
    // Now, on the store's clock: one completed, a live lease, a key retried once (live).
    let store = t.library(None).await;
    let lease = acquire(&*store, "new-done", Duration::from_secs(60)).await;
    store
        .commit(&lease, Some(b"charged 42"))
        .await
        .expect("commit");
    let live = acquire(&*store, "live", Duration::from_secs(600)).await;
    let first = acquire(&*store, "retried", Duration::from_secs(60)).await;
    store.release(&first).await.expect("release");
    acquire(&*store, "retried", Duration::from_secs(1200)).await;
    let other = Key::new("shipping", "new-done").expect("key");
    let lease = store
        .claim(&other, &ClaimOptions::default())
        .await
        .expect("claim")
        .into_lease()
        .expect("acquired");
    store.commit(&lease, None).await.expect("commit");

    let stats = t.json(&["stats"]);
    assert_eq!(
        (&stats["in_flight"], &stats["expired"], &stats["completed"]),
        (&Value::from(2), &Value::from(1), &Value::from(4)),
        "{stats}"
    );
    assert_eq!(stats["oldest_live"]["message_id"], "live", "{stats}");
    assert!(stats["last_purge"].is_null(), "no purge ran yet: {stats}");
    assert_eq!(stats["most_retried"][0]["message_id"], "retried", "{stats}");
    assert_eq!(stats["most_retried"][0]["attempt"], 2, "{stats}");
    assert_eq!(
        stats["size_bytes"].is_u64(),
        matches!(
            t.backend,
            Backend::Sqlite | Backend::Postgres | Backend::MySql
        ),
        "size known for SQL stores only: {stats}"
    );
    let human = String::from_utf8_lossy(&t.expect(0, &["stats"]).stdout).into_owned();
    assert!(
        human.contains("in flight:   2") && human.contains("oldest live lease: billing / live"),
        "{human}"
    );

    let done = t.json(&["inspect", "billing", "new-done"]);
    assert_eq!(
        (&done["status"], &done["outcome"]["text"], &done["fence"]),
        (
            &Value::from("completed"),
            &Value::from("charged 42"),
            &Value::from(1)
        ),
        "{done}"
    );
    let human =
        String::from_utf8_lossy(&t.expect(0, &["inspect", "billing", "old-2"]).stdout).into_owned();
    assert!(
        human.contains("0xff00 (2 bytes, not UTF-8)") && human.contains(" ago)"),
        "{human}"
    );
    // The first claim's time, two days back, where the backend keeps it.
    let old2 = t.json(&["inspect", "billing", "old-2"]);
    let first_ms = old2["first_claimed_at"]["ms"].as_i64();
    if !matches!(t.backend, Backend::Redis | Backend::RedisCluster) {
        let day_ago = SystemClock.now().as_millis() - 86_400_000;
        assert!(first_ms.is_some_and(|ms| ms < day_ago), "{old2}");
        assert!(human.contains("first claimed:"), "{human}");
    } else {
        assert!(old2["first_claimed_at"].is_null(), "{old2}");
    }
    let missing = t.expect(3, &["inspect", "billing", "nope"]);
    assert!(
        stderr(&missing).starts_with("error: no record for billing/nope"),
        "{}",
        stderr(&missing)
    );

    let all = t.json(&["list", "--consumer", "billing"]);
    assert_eq!(
        ids(&all),
        ["live", "new-done", "old-1", "old-2", "old-stuck", "retried"]
    );
    let expired = t.json(&["list", "--consumer", "billing", "--state", "expired"]);
    assert_eq!(ids(&expired), ["old-stuck"]);
    let page = t.json(&["list", "--consumer", "billing", "--limit", "2"]);
    assert_eq!(
        (ids(&page), &page["next_after"]),
        (vec!["live", "new-done"], &Value::from("new-done"))
    );
    let next = t.json(&[
        "list",
        "--consumer",
        "billing",
        "--limit",
        "2",
        "--after",
        "new-done",
    ]);
    assert_eq!(ids(&next), ["old-1", "old-2"]);
    assert_eq!(
        ids(&t.json(&["list", "--consumer", "shipping"])),
        ["new-done"]
    );
    t.expect(2, &["list", "--consumer", "billing", "--state", "stuck"]);

    // Release: refused without --force, then revoking: the old worker loses the lease at
    // once, and the next claim is a takeover.
    let refused = t.expect(1, &["release", "billing", "live"]);
    assert!(stderr(&refused).contains("--force"), "{}", stderr(&refused));
    let released = t.json(&["release", "billing", "live", "--force"]);
    assert_eq!(
        (&released["released"], &released["fence"]),
        (&Value::from(true), &Value::from(1))
    );
    assert!(
        store.commit(&live, None).await.unwrap_err().is_lease_lost(),
        "the old worker's commit right after the release is LeaseLost"
    );
    let next = acquire(&*store, "live", Duration::from_secs(60)).await;
    assert_eq!(
        (next.fence, next.attempt),
        (live.fence + 1, 2),
        "re-claim after release"
    );
    store
        .commit(&next, None)
        .await
        .expect("the new lease commits");
    t.expect(3, &["release", "billing", "nope"]);
    let completed = t.expect(1, &["release", "billing", "new-done"]);
    assert!(
        stderr(&completed).contains("dedup forget billing new-done"),
        "{}",
        stderr(&completed)
    );

    // Forget: a completed record goes, and the message runs again as new.
    let forgot = t.json(&["forget", "billing", "new-done"]);
    assert_eq!(
        (
            &forgot["forgot"],
            &forgot["status"],
            &forgot["fence"],
            &forgot["attempt"]
        ),
        (
            &Value::from(true),
            &Value::from("completed"),
            &Value::from(1),
            &Value::from(1)
        ),
        "{forgot}"
    );
    t.expect(3, &["inspect", "billing", "new-done"]);
    t.expect(3, &["forget", "billing", "new-done"]);
    let again = acquire(&*store, "new-done", Duration::from_secs(60)).await;
    assert_eq!(
        (again.fence, again.attempt),
        (1, 1),
        "a forgotten key starts over"
    );
    store.commit(&again, None).await.expect("commit");
    // A live lease needs --force; its worker then loses it.
    let held = t.expect(1, &["forget", "billing", "retried"]);
    assert!(stderr(&held).contains("--force"), "{}", stderr(&held));
    t.expect(0, &["inspect", "billing", "retried"]);
    let human = t.expect(0, &["forget", "billing", "retried", "--force"]);
    assert!(
        String::from_utf8_lossy(&human.stdout)
            .starts_with("forgot billing/retried (in-flight, fence 2, attempt 2)"),
        "{}",
        String::from_utf8_lossy(&human.stdout)
    );
    let again = acquire(&*store, "retried", Duration::from_secs(1200)).await;
    assert_eq!(
        (again.fence, again.attempt),
        (1, 1),
        "a forgotten key starts over"
    );

    // Purge: the dry run counts, removes nothing; the purge removes exactly the old ones.
    let dry = t.json(&["purge", "--older-than", "1d", "--dry-run"]);
    assert_eq!(
        (&dry["completed"], &dry["expired"]),
        (&Value::from(2), &Value::from(1)),
        "{dry}"
    );
    t.expect(0, &["inspect", "billing", "old-1"]);
    assert!(
        t.json(&["stats"])["last_purge"].is_null(),
        "a dry run is no purge run"
    );
    let purged = t.json(&["purge", "--older-than", "1d", "--batch", "2"]);
    assert_eq!(
        (&purged["completed"], &purged["expired"]),
        (&Value::from(2), &Value::from(1)),
        "{purged}"
    );
    // The store keeps the run: `dedup stats` (another process) shows it.
    let last = t.json(&["stats"])["last_purge"].clone();
    assert_eq!(
        (&last["removed"], &last["stopped_early"]),
        (&Value::from(3), &Value::from(false)),
        "{last}"
    );
    let human = String::from_utf8_lossy(&t.expect(0, &["stats"]).stdout).into_owned();
    assert!(
        human.contains("last purge:  finished ") && human.contains("removed 3 in "),
        "{human}"
    );
    for id in ["old-1", "old-2", "old-stuck"] {
        t.expect(3, &["inspect", "billing", id]);
    }
    let left = t.json(&["list", "--consumer", "billing"]);
    assert_eq!(ids(&left), ["live", "new-done", "retried"]);
    let plain = t.expect(0, &["purge", "--older-than", "1d"]);
    assert!(
        String::from_utf8_lossy(&plain.stdout).starts_with("removed 0 records"),
        "{}",
        String::from_utf8_lossy(&plain.stdout)
    );
    assert!(
        stderr(&plain).starts_with("purging records older than 1d: 0 to remove"),
        "{}",
        stderr(&plain)
    );
    poison_scenario(&t).await;
    eprintln!("{:?} scenario: {:?}", t.backend, started.elapsed());
}

/// A poison message dead-lettered by a real `Inbox` on the store: `stats` counts it as
/// dead-lettered, never processed; `list --state dead-letter` lists it; `inspect` shows the
/// state, the attempts and the stored cause; `consumers` counts it; `forget` reports the
/// same attempt numbers.
async fn poison_scenario(t: &Target) {
    let store = t.library(None).await;
    let inbox = dedup_core::Inbox::from_arc(
        Arc::clone(&store),
        dedup_core::InboxConfig {
            max_attempts: Some(2),
            ..dedup_core::InboxConfig::default()
        },
    )
    .with_worker("billing-7");
    let poison = Key::new("orders", "poison-1").expect("key");
    let fail = |_| async {
        Err::<Option<Vec<u8>>, _>(std::io::Error::other(
            "invoice payload: expected value at line 1 column 1",
        ))
    };
    for _ in 0..2 {
        assert!(inbox.handle(&poison, None, fail).await.is_err());
    }
    let keeps = store.capabilities().failure_causes;
    if keeps {
        let released = t.json(&["inspect", "orders", "poison-1"]);
        assert_eq!(released["status"], "expired", "{released}");
        assert_eq!(released["cause"]["attempt"], 2, "{released}");
    }
    let handled = inbox
        .handle(&poison, None, fail)
        .await
        .expect("dead letter");
    assert!(
        matches!(handled, dedup_core::Handled::DeadLetter { attempts: 2, .. }),
        "{handled:?}"
    );
    let before = t.json(&["stats"]);
    assert_eq!(before["dead_lettered"], 1, "{before}");
    assert_eq!(
        before["completed"], 3,
        "a dead letter is not processed: {before}"
    );
    let listed = t.json(&["list", "--consumer", "orders", "--state", "dead-letter"]);
    assert_eq!(ids(&listed), ["poison-1"], "{listed}");
    let processed = t.json(&["list", "--consumer", "orders", "--state", "completed"]);
    assert!(ids(&processed).is_empty(), "{processed}");
    let dead = t.json(&["inspect", "orders", "poison-1"]);
    assert_eq!(
        (&dead["status"], &dead["attempts_used"], &dead["attempt"]),
        (
            &Value::from("dead-letter"),
            &Value::from(2),
            &Value::from(3)
        ),
        "{dead}"
    );
    let human = String::from_utf8_lossy(&t.expect(0, &["inspect", "orders", "poison-1"]).stdout)
        .into_owned();
    assert!(
        human.contains("dead-lettered after 2 attempts (attempt 3 found none left"),
        "{human}"
    );
    assert!(!human.contains("completed (processed"), "{human}");
    // The list, with the consumer given as in `inspect`, says when it was dead-lettered and
    // (where causes are kept) why, on the key's line.
    let line = String::from_utf8_lossy(
        &t.expect(0, &["list", "orders", "--state", "dead-letter"])
            .stdout,
    )
    .into_owned();
    assert!(
        line.starts_with("poison-1") && line.contains(" dead-lettered 20"),
        "{line}"
    );
    assert_eq!(
        line.contains(": invoice payload: expected value at line 1 column 1"),
        keeps,
        "{line}"
    );
    if keeps {
        assert_eq!(dead["cause"]["kind"], "handler", "{dead}");
        assert_eq!(dead["cause"]["attempt"], 2, "{dead}");
        assert_eq!(dead["cause"]["worker"], "billing-7", "{dead}");
        assert!(
            human.contains("last failure:    handler error at attempt 2")
                && human.contains("invoice payload: expected value at line 1 column 1")
                && human.contains("on billing-7"),
            "{human}"
        );
    } else {
        assert_eq!(dead["cause"]["kind"], "attempts", "{dead}");
    }
    // A failure stored as the key's result (FailurePolicy::Store) is `failed`, with its cause.
    let storing = dedup_core::Inbox::from_arc(
        Arc::clone(&store),
        dedup_core::InboxConfig {
            failures: dedup_core::FailurePolicy::Store,
            ..dedup_core::InboxConfig::default()
        },
    );
    let declined = Key::new("orders", "declined-1").expect("key");
    let handled = storing
        .handle(&declined, None, |_| async {
            Err::<Option<Vec<u8>>, _>(std::io::Error::other("card declined (code 51)"))
        })
        .await
        .expect("stored failure");
    assert!(
        matches!(handled, dedup_core::Handled::Failed { .. }),
        "{handled:?}"
    );
    let failed = t.json(&["list", "--consumer", "orders", "--state", "failed"]);
    assert_eq!(ids(&failed), ["declined-1"], "{failed}");
    let human = String::from_utf8_lossy(&t.expect(0, &["inspect", "orders", "declined-1"]).stdout)
        .into_owned();
    assert!(
        human.contains("failed (the failure is its result")
            && human.contains("failed with:     handler error at attempt 1")
            && human.contains("card declined (code 51)"),
        "{human}"
    );
    let consumers = t.json(&["consumers"]);
    let orders = consumers["consumers"]
        .as_array()
        .expect("consumers")
        .iter()
        .find(|c| c["consumer"] == "orders")
        .unwrap_or_else(|| panic!("orders is listed: {consumers}"));
    assert_eq!(orders["counts"]["dead-letter"], 1, "{consumers}");
    assert_eq!(orders["counts"]["failed"], 1, "{consumers}");
    assert_eq!(orders["counts"]["completed"], 0, "{consumers}");
    let names: Vec<&str> = consumers["consumers"]
        .as_array()
        .expect("consumers")
        .iter()
        .filter_map(|c| c["consumer"].as_str())
        .collect();
    assert_eq!(names, ["billing", "orders", "shipping"], "{consumers}");
    // Kept counts: the same consumers and counts; a store that cannot keep them says so.
    if matches!(
        t.backend,
        Backend::Sqlite | Backend::Postgres | Backend::MySql
    ) {
        assert_eq!(t.json(&["counts", "status"])["source"], "scan");
        let enabled = t.json(&["counts", "enable"]);
        assert_eq!(
            (&enabled["changed"], &enabled["source"]),
            (&Value::from(true), &Value::from("kept")),
            "{enabled}"
        );
        assert_eq!(t.json(&["counts", "enable"])["changed"], false);
        assert_eq!(t.json(&["consumers"])["consumers"], consumers["consumers"]);
        let disabled = t.json(&["counts", "disable"]);
        assert_eq!(
            (&disabled["changed"], &disabled["source"]),
            (&Value::from(true), &Value::from("scan")),
            "{disabled}"
        );
    } else {
        let refused = t.expect(1, &["counts", "enable"]);
        assert!(
            stderr(&refused).contains("kept counts exist on SQLite, PostgreSQL and MySQL"),
            "{}",
            stderr(&refused)
        );
    }
    let forgot = String::from_utf8_lossy(&t.expect(0, &["forget", "orders", "poison-1"]).stdout)
        .into_owned();
    assert!(
        forgot.contains("(dead-lettered after 2 attempts, fence 3, attempt 3)"),
        "{forgot}"
    );
}

#[tokio::test]
async fn cli_on_sqlite() {
    scenario(Target::sqlite()).await;
}

/// The scenario on a server's target; `None` (the server's variable unset) is a skip, as
/// `server_url` allows it.
async fn scenario_on(target: Option<Target>, variable: &str) {
    match target {
        Some(t) => scenario(t).await,
        None => eprintln!("SKIPPED: {variable} is not set"),
    }
}

#[tokio::test]
async fn cli_on_postgres() {
    scenario_on(Target::postgres(), "DEDUP_POSTGRES_URL").await;
}

#[tokio::test]
async fn cli_on_mysql() {
    scenario_on(Target::mysql(), "DEDUP_MYSQL_URL").await;
}

#[tokio::test]
async fn cli_on_redis() {
    scenario_on(Target::redis(Backend::Redis), "DEDUP_REDIS_URL").await;
}

#[tokio::test]
async fn cli_on_redis_cluster() {
    scenario_on(
        Target::redis(Backend::RedisCluster),
        "DEDUP_REDIS_CLUSTER_URLS",
    )
    .await;
}

#[tokio::test]
async fn cli_on_nats_kv() {
    scenario_on(Target::nats_kv(), "DEDUP_NATS_CLUSTER_URLS").await;
}

/// The binary is built with TLS: `dedup stats` reaches the TLS-only PostgreSQL, verifying
/// its certificate against the test CA.
#[test]
fn stats_reach_the_tls_only_postgres() {
    let (Some(url), Some(ca)) = (
        server_url("DEDUP_POSTGRES_TLS_URL"),
        server_url("DEDUP_TLS_CA"),
    ) else {
        eprintln!("SKIPPED stats_reach_the_tls_only_postgres: DEDUP_POSTGRES_TLS_URL is not set");
        return;
    };
    let store = format!(
        "{url}?sslmode=verify-full&sslrootcert={ca}&table={}",
        unique("cli_tls")
    );
    let run = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_dedup"))
            .args(args)
            .args(["--store", &store, "--json"])
            .env_remove("DEDUP_STORE_URL")
            .output()
            .expect("run dedup");
        assert_eq!(
            output.status.code(),
            Some(0),
            "dedup {args:?} over TLS: {}",
            stderr(&output)
        );
        serde_json::from_slice::<Value>(&output.stdout).expect("JSON")
    };
    assert_eq!(run(&["migrate"])["migrated"], true);
    let stats = run(&["stats"]);
    assert_eq!(
        (&stats["backend"], &stats["total"]),
        (&Value::from("postgres"), &Value::from(0)),
        "{stats}"
    );
}

/// The commands that only read never migrate: `dedup stats` succeeds as a role that may
/// only read the records and versions tables (it cannot create anything in their schema),
/// and a missing table is an error naming `dedup migrate`, with nothing created.
#[tokio::test]
async fn reading_commands_never_migrate_and_work_as_a_read_only_role() {
    let Some(admin_url) = server_url("DEDUP_POSTGRES_URL") else {
        eprintln!("SKIPPED reading_commands_never_migrate: DEDUP_POSTGRES_URL is not set");
        return;
    };
    let schema = unique("cli_ro");
    let role = unique("cli_reader");
    let admin = PostgresStore::connect_with(
        &admin_url,
        PostgresConfig {
            schema: schema.clone(),
            sql: SqlSettings {
                max_connections: 2,
                ..Default::default()
            },
            ..PostgresConfig::default()
        },
    )
    .await
    .expect("connect and migrate as the admin role");
    let lease = acquire(&*Arc::new(admin.clone()), "ro-1", Duration::from_secs(60)).await;
    admin.commit(&lease, None).await.expect("commit");
    let setup = format!(
        "CREATE ROLE \"{role}\" LOGIN PASSWORD 'reader'; \
         GRANT USAGE ON SCHEMA \"{schema}\" TO \"{role}\"; \
         GRANT SELECT ON \"{schema}\".dedup_inbox, \"{schema}\".dedup_schema_versions \
           TO \"{role}\";"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(setup))
        .execute(admin.pool())
        .await
        .expect("create the read-only role");
    let mut reader = url::Url::parse(&admin_url).expect("DEDUP_POSTGRES_URL");
    reader.set_username(&role).expect("user");
    reader.set_password(Some("reader")).expect("password");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_dedup"))
            .args(args)
            .args(["--store", reader.as_str(), "--schema", &schema])
            .env_remove("DEDUP_STORE_URL")
            .output()
            .expect("run dedup")
    };
    let can_create: bool = sqlx::query_scalar("SELECT has_schema_privilege($1, $2, 'CREATE')")
        .bind(&role)
        .bind(&schema)
        .fetch_one(admin.pool())
        .await
        .expect("privilege");
    assert!(!can_create, "the role must not be able to create tables");
    let migrate = run(&["migrate"]);
    assert_eq!(
        migrate.status.code(),
        Some(1),
        "the role cannot migrate: {}",
        stderr(&migrate)
    );
    let stats = run(&["stats", "--json"]);
    assert_eq!(stats.status.code(), Some(0), "{}", stderr(&stats));
    let stats: Value = serde_json::from_slice(&stats.stdout).expect("JSON");
    assert_eq!(stats["completed"], 1, "{stats}");
    // It may not read the purge runs: the stats say why the last run is unknown.
    let why = stats["last_purge_error"].as_str().unwrap_or_default();
    assert!(why.contains("permission denied"), "{stats}");
    let inspect = run(&["inspect", "billing", "ro-1"]);
    assert_eq!(inspect.status.code(), Some(0), "{}", stderr(&inspect));
    let dry = run(&["purge", "--older-than", "1d", "--dry-run"]);
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));

    // A table that does not exist: the admin's read creates nothing and names the fix.
    let missing = Command::new(env!("CARGO_BIN_EXE_dedup"))
        .args(["stats", "--store", &admin_url, "--schema", &schema])
        .args(["--table", "never_migrated"])
        .env_remove("DEDUP_STORE_URL")
        .output()
        .expect("run dedup");
    assert_eq!(missing.status.code(), Some(1), "{}", stderr(&missing));
    assert!(
        stderr(&missing).contains("run `dedup migrate` first"),
        "{}",
        stderr(&missing)
    );
    let created: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(format!("\"{schema}\".never_migrated"))
        .fetch_one(admin.pool())
        .await
        .expect("regclass");
    assert!(!created, "a read created no table");

    let teardown = format!("DROP SCHEMA \"{schema}\" CASCADE; DROP ROLE \"{role}\";");
    sqlx::raw_sql(sqlx::AssertSqlSafe(teardown))
        .execute(admin.pool())
        .await
        .expect("drop the schema and the role");
}

#[test]
fn usage_errors_exit_2_and_a_missing_store_says_what_to_do() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_dedup"))
            .args(args)
            .env_remove("DEDUP_STORE_URL")
            .output()
            .expect("run dedup")
    };
    let no_store = run(&["stats"]);
    assert_eq!(no_store.status.code(), Some(2));
    assert!(
        stderr(&no_store).contains("DEDUP_STORE_URL"),
        "{}",
        stderr(&no_store)
    );
    assert_eq!(run(&["frobnicate"]).status.code(), Some(2));
    // `list` needs its consumer, given once (as an argument or as `--consumer`).
    let unnamed = run(&["--store", "memory:", "list"]);
    assert_eq!(unnamed.status.code(), Some(2));
    assert!(
        stderr(&unnamed).contains("<CONSUMER>"),
        "{}",
        stderr(&unnamed)
    );
    let twice = run(&["--store", "memory:", "list", "a", "--consumer", "b"]);
    assert_eq!(twice.status.code(), Some(2), "{}", stderr(&twice));
    // An unknown scheme (mysql:// became a store with dedup-mysql).
    let bad_url = run(&["--store", "oracle://x", "stats"]);
    assert_eq!(bad_url.status.code(), Some(2));
    assert!(
        !stderr(&bad_url).contains("InvalidInput"),
        "no Debug dumps: {}",
        stderr(&bad_url)
    );
    let down = run(&[
        "--store",
        "postgres://nobody@127.0.0.1:1/none?connect_timeout=1s",
        "stats",
    ]);
    assert_eq!(down.status.code(), Some(1));
    let text = stderr(&down);
    assert!(
        text.starts_with("error: cannot open the postgres store\ncaused by: "),
        "{text}"
    );
    assert!(text.contains("\nhint: "), "{text}");
}

/// Enqueue `messages` through the library, in a committed transaction, on a store on
/// `clock`; its outbox for the relay's calls.
async fn outbox_on(
    t: &Target,
    clock: Option<Arc<dyn Clock>>,
    messages: &[dedup_core::outbox::OutboxMessage],
) -> Arc<dyn dedup_core::outbox::OutboxStore> {
    match t.backend {
        Backend::Sqlite => {
            let store = SqliteStore::open_with(
                &t.url,
                SqliteConfig {
                    clock,
                    ..SqliteConfig::default()
                },
            )
            .await
            .expect("open sqlite");
            let conn = store.open_connection().expect("connection");
            store.outbox().enqueue(&conn, messages).expect("enqueue");
            Arc::new(store.outbox())
        }
        Backend::Postgres => {
            let store = PostgresStore::connect_with(
                &t.url,
                PostgresConfig {
                    sql: SqlSettings {
                        table: t.name.clone(),
                        clock,
                        max_connections: 2,
                        ..Default::default()
                    },
                    ..PostgresConfig::default()
                },
            )
            .await
            .expect("connect postgres");
            let mut tx = store.pool().begin().await.expect("begin");
            store
                .outbox()
                .enqueue(&mut tx, messages)
                .await
                .expect("enqueue");
            tx.commit().await.expect("commit");
            Arc::new(store.outbox())
        }
        Backend::MySql => {
            let store = MySqlStore::connect_with(
                &t.url,
                MySqlConfig::from(SqlSettings {
                    table: t.name.clone(),
                    clock,
                    max_connections: 2,
                    ..Default::default()
                }),
            )
            .await
            .expect("connect mysql");
            let mut tx = store.pool().begin().await.expect("begin");
            store
                .outbox()
                .enqueue(&mut tx, messages)
                .await
                .expect("enqueue");
            tx.commit().await.expect("commit");
            Arc::new(store.outbox())
        }
        _ => unreachable!("the outbox lives in SQL stores"),
    }
}

/// `dedup outbox stats | list | retry | purge` on rows written through the library: one
/// sent and one dead two days ago, one pending now.
async fn outbox_scenario(t: Target) {
    use dedup_core::outbox::{AfterFailure, OutboxMessage};
    let message = |id: &str| OutboxMessage::new("invoices", id, b"x".to_vec()).unwrap();
    let two_days_ago = Arc::new(ManualClock::new(
        SystemClock
            .now()
            .saturating_sub(Duration::from_secs(2 * 24 * 3600)),
    ));
    let old = outbox_on(
        &t,
        Some(two_days_ago),
        &[message("sent-1"), message("dead-1")],
    )
    .await;
    let held = old.take(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(held.rows.len(), 2);
    let (sent, dead) = (held.rows[0].id, held.rows[1].id);
    assert_eq!(
        old.mark_sent(&held.token, &[sent]).await.unwrap(),
        vec![sent]
    );
    assert!(
        old.mark_failed(&held.token, dead, "the broker said no", AfterFailure::Dead)
            .await
            .unwrap()
    );
    outbox_on(&t, None, &[message("pending-1")]).await;

    let stats = t.json(&["outbox", "stats"]);
    assert_eq!(
        (
            &stats["pending"],
            &stats["held"],
            &stats["sent"],
            &stats["dead"]
        ),
        (
            &Value::from(1),
            &Value::from(0),
            &Value::from(1),
            &Value::from(1)
        ),
        "{stats}"
    );
    let invoices = &stats["destinations"][0];
    assert_eq!(
        (
            &invoices["destination"],
            &invoices["pending"],
            &invoices["sent"],
            &invoices["dead"]
        ),
        (
            &Value::from("invoices"),
            &Value::from(1),
            &Value::from(1),
            &Value::from(1)
        ),
        "{stats}"
    );
    assert_eq!(stats["destinations"].as_array().map(Vec::len), Some(1));
    let text = String::from_utf8_lossy(&t.expect(0, &["outbox", "stats"]).stdout).into_owned();
    assert!(text.contains("dead:     1"), "{text}");
    assert!(
        text.contains("invoices: pending 1, held 0, sent 1, dead 1, oldest unsent "),
        "{text}"
    );

    let list = t.json(&["outbox", "list", "--state", "dead"]);
    let rows = list["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1, "{list}");
    assert_eq!(rows[0]["message_id"], "dead-1");
    assert_eq!(rows[0]["last_error"], "the broker said no");
    let all = t.json(&[
        "outbox",
        "list",
        "--destination",
        "invoices",
        "--limit",
        "2",
    ]);
    assert_eq!(all["rows"].as_array().unwrap().len(), 2, "{all}");

    let retried = t.json(&["outbox", "retry", &dead.to_string()]);
    assert_eq!(retried["retried"], true);
    t.expect(3, &["outbox", "retry", &sent.to_string()]);
    let stats = t.json(&["outbox", "stats"]);
    assert_eq!(
        (&stats["pending"], &stats["dead"]),
        (&Value::from(2), &Value::from(0))
    );

    let purged = t.json(&["outbox", "purge", "--retention", "1d"]);
    assert_eq!(purged["removed"], 1, "{purged}");
    let stats = t.json(&["outbox", "stats"]);
    assert_eq!(
        (&stats["sent"], &stats["pending"]),
        (&Value::from(0), &Value::from(2))
    );
    t.expect(2, &["outbox", "purge", "--retention", "soon"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_outbox_on_sqlite() {
    outbox_scenario(Target::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_outbox_on_postgres() {
    match Target::postgres() {
        Some(t) => outbox_scenario(t).await,
        None => eprintln!("SKIPPED cli_outbox_on_postgres: DEDUP_POSTGRES_URL is not set"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_outbox_on_mysql() {
    match Target::mysql() {
        Some(t) => outbox_scenario(t).await,
        None => eprintln!("SKIPPED cli_outbox_on_mysql: DEDUP_MYSQL_URL is not set"),
    }
}

/// A store without an outbox is a usage error naming the SQL stores, before any
/// connection (nothing listens on port 1).
#[test]
fn the_outbox_of_a_redis_or_nats_kv_store_is_refused() {
    for store in [
        "redis://127.0.0.1:1/0",
        "nats-kv://127.0.0.1:1/?bucket=dedup_tests",
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_dedup"))
            .args(["outbox", "stats", "--store", store])
            .env_remove("DEDUP_STORE_URL")
            .output()
            .expect("run dedup");
        assert_eq!(output.status.code(), Some(2), "{store}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("the outbox needs a SQL store"),
            "{store}: {stderr}"
        );
    }
}
