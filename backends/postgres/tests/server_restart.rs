//! A PostgreSQL server that crashes and restarts under a live store (immediate-mode stop:
//! no shutdown checkpoint, WAL replay on start): every acknowledged commit, its outcome and
//! a live lease survive; the store's pool reconnects by itself, the first operations failing
//! at most with a retryable error.
//!
//! The test runs its own server through `scripts/services.sh` in a private state dir (the
//! shared test server must not be restarted under the other tests), with
//! `synchronous_commit = on`: the scripts' test servers run with it off for speed, and with
//! it off a crash may lose the last fraction of a second of commits (see the README).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use dedup_core::{Claim, ClaimOptions, DedupStore, Key, Result};
use dedup_postgres::{PostgresStore, sqlx};

/// A private PostgreSQL from scripts/services.sh, stopped (and its folder removed) on drop.
struct Server {
    dir: PathBuf,
    url: String,
}

fn services(dir: &PathBuf, args: &[&str]) -> std::io::Result<std::process::Output> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services.sh");
    Command::new(script)
        .args(args)
        .env("DEDUP_SERVICES_DIR", dir)
        .output()
}

impl Server {
    fn start() -> Option<Self> {
        let dir = std::env::temp_dir().join(format!("dedup-pg-restart-{}", std::process::id()));
        let started = services(&dir, &["start", "postgres"]);
        let ok = matches!(&started, Ok(out) if out.status.success());
        if !ok {
            let why = match started {
                Ok(out) => String::from_utf8_lossy(&out.stderr).into_owned(),
                Err(e) => e.to_string(),
            };
            let _ = services(&dir, &["stop"]);
            assert!(
                !dedup_conformance::strict(),
                "cannot start a private PostgreSQL: {why}"
            );
            eprintln!("SKIPPED: cannot start a private PostgreSQL: {why}");
            return None;
        }
        let env = services(&dir, &["env"]).expect("services.sh env");
        let env = String::from_utf8_lossy(&env.stdout).into_owned();
        let url = env
            .lines()
            .find_map(|l| l.strip_prefix("export DEDUP_POSTGRES_URL="))
            .map(|v| v.trim_matches(|c| c == '\'' || c == '"').to_string())
            .unwrap_or_else(|| panic!("no DEDUP_POSTGRES_URL in {env}"));
        Some(Server { dir, url })
    }

    fn crash_restart(&self) {
        let out = services(&self.dir, &["crash-restart", "postgres"]).expect("crash-restart");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = services(&self.dir, &["stop"]);
    }
}

async fn until_reconnected<T, F, Fut>(mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(
                    e.is_retryable(),
                    "a failure after a restart must be retryable: {e:?}"
                );
                assert!(
                    Instant::now() < deadline,
                    "the store did not reconnect: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn key(i: usize) -> Key {
    Key::new("billing", format!("order-{i}")).expect("key")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_and_restarted_server_keeps_every_acknowledged_commit_and_lease() {
    let Some(server) = Server::start() else {
        return;
    };
    let admin = sqlx::PgPool::connect(&server.url)
        .await
        .expect("admin connection");
    for statement in [
        "ALTER SYSTEM SET synchronous_commit = on",
        "SELECT pg_reload_conf()",
    ] {
        sqlx::raw_sql(statement)
            .execute(&admin)
            .await
            .expect("synchronous_commit on");
    }
    admin.close().await;

    let store = PostgresStore::connect(&server.url).await.expect("connect");
    let opts = ClaimOptions::lease(Duration::from_secs(120));
    for i in 0..50 {
        let lease = store
            .claim(&key(i), &opts)
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        store
            .commit(&lease, Some(format!("invoice-{i}").as_bytes()))
            .await
            .unwrap();
    }
    let live = store
        .claim(&key(50), &opts)
        .await
        .unwrap()
        .into_lease()
        .unwrap();

    server.crash_restart();

    for i in 0..50 {
        let k = key(i);
        match until_reconnected(|| store.claim(&k, &opts)).await {
            Claim::Completed { outcome, .. } => {
                assert_eq!(outcome, Some(format!("invoice-{i}").into_bytes()))
            }
            other => panic!("order-{i} was committed before the crash, got {other:?}"),
        }
    }
    let k = key(50);
    match until_reconnected(|| store.claim(&k, &opts)).await {
        Claim::InFlight {
            expires_at,
            attempt,
        } => {
            assert_eq!((expires_at, attempt), (live.expires_at, 1))
        }
        other => panic!("the live lease must survive, got {other:?}"),
    }
    until_reconnected(|| store.commit(&live, None)).await;
}
