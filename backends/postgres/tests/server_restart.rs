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

use dedup_conformance::restart::acknowledged_records_survive_a_restart;
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
    acknowledged_records_survive_a_restart(&store, || server.crash_restart()).await;
}
