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

use dedup_conformance::restart::{acknowledged_records_survive_a_restart, until_reconnected};
use dedup_core::{Claim, ClaimOptions, DedupStore, Key};
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
    acknowledged_records_survive_a_restart(&store, || {
        server.kill();
        server.spawn().expect("restart redis-server");
    })
    .await;
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
