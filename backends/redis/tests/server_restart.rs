//! A Redis server killed (SIGKILL) and restarted under a live store: what survives is what
//! the server's persistence kept, exactly as the README's durability table says.
//! - `appendonly yes` + `appendfsync always`: every acknowledged commit and claim survives;
//!   duplicates after the restart are still `Completed`, the live lease still `InFlight`.
//! - no persistence: the restart forgets the records, so a redelivered message would be
//!   processed again (the documented limit, shown here so it cannot silently change).
//!
//! Each test runs its own redis-server on a free port (the binary the test script installs).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dedup_core::{Claim, ClaimOptions, DedupStore, Key, Result};
use dedup_redis::{RedisStore, redis};

/// A private redis-server, killed and removed on drop.
struct Server {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
    persistence: &'static [&'static str],
}

impl Server {
    /// Start one, or `None` (skip) when redis-server cannot run and the run is not strict.
    fn start(name: &str, persistence: &'static [&'static str]) -> Option<Self> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir =
            std::env::temp_dir().join(format!("dedup-redis-restart-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("server dir");
        let mut server = Server {
            child: None,
            dir,
            port,
            persistence,
        };
        match server.spawn() {
            Ok(()) => Some(server),
            Err(e) if !dedup_conformance::strict() => {
                eprintln!("SKIPPED: cannot run redis-server ({e})");
                None
            }
            Err(e) => panic!("cannot run redis-server: {e}"),
        }
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", ""])
            .args(self.persistence)
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        self.wait_ready();
        Ok(())
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = self.url();
        loop {
            let ready = redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok_and(|pong| pong == "PONG");
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not start in 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no shutdown save, no flush beyond what the fsync policy already did.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The first operations after a restart may fail while the store reconnects; they must
/// fail retryably, and succeed within a bounded time.
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
async fn aof_always_keeps_every_acknowledged_commit_and_lease_across_a_kill_and_restart() {
    let Some(mut server) =
        Server::start("aof", &["--appendonly", "yes", "--appendfsync", "always"])
    else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let lease_opts = ClaimOptions::lease(Duration::from_secs(120));
    for i in 0..50 {
        let lease = store
            .claim(&key(i), &lease_opts)
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
        .claim(&key(50), &lease_opts)
        .await
        .unwrap()
        .into_lease()
        .unwrap();

    server.kill();
    server.spawn().expect("restart redis-server");

    for i in 0..50 {
        let k = key(i);
        match until_reconnected(|| store.claim(&k, &lease_opts)).await {
            Claim::Completed { outcome, .. } => {
                assert_eq!(outcome, Some(format!("invoice-{i}").into_bytes()))
            }
            other => panic!("order-{i} was committed before the kill, got {other:?}"),
        }
    }
    match store.claim(&key(50), &lease_opts).await.unwrap() {
        Claim::InFlight {
            expires_at,
            attempt,
        } => {
            assert_eq!((expires_at, attempt), (live.expires_at, 1));
        }
        other => panic!("the live lease must survive, got {other:?}"),
    }
    // The lease's owner can still finish its work.
    store.commit(&live, None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_persistence_a_restart_forgets_records_as_documented() {
    let Some(mut server) = Server::start("none", &["--appendonly", "no"]) else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let opts = ClaimOptions::lease(Duration::from_secs(120));
    let lease = store
        .claim(&key(1), &opts)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    store.commit(&lease, None).await.unwrap();

    server.kill();
    server.spawn().expect("restart redis-server");

    // The record is gone: a redelivery would be processed again (fence restarts at 1), and
    // the old lease is lost. This is the README's "no persistence" row.
    let k = key(1);
    let again = until_reconnected(|| store.claim(&k, &opts)).await;
    assert!(
        matches!(again, Claim::Acquired(ref l) if l.fence == 1),
        "{again:?}"
    );
    assert!(
        store
            .commit(&lease, None)
            .await
            .unwrap_err()
            .is_lease_lost()
    );
}
