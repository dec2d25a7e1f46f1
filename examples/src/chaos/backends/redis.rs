//! Redis in the chaos harness: the store lives in a private `redis-server` of the run
//! (`appendonly yes`, `appendfsync always`), SIGKILLed and restarted once. Lease mode
//! only: Redis has no transaction an effect row could join.
//!
//! Failover runs: a primary with two replicas, the store behind a [`SwitchingProxy`];
//! the primary is SIGKILLed and the replica with the highest replication offset promoted
//! (`REPLICAOF NO ONE`), the other pointed at it, as Sentinel does. "Sync" replication is
//! the store's `WAIT` after each commit (`wait_replicas=1`).
//!
//! The server binary is `redis-server`, or the one `DEDUP_CHAOS_REDIS_SERVER` names (a
//! `valkey-server`, for Valkey's figures: `scripts/services.sh start valkey` fetches one).

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{BoxError, ChaosBackend, Restart, StoreServer};
use crate::chaos::Replication;
use crate::chaos::proxy::SwitchingProxy;

/// The Redis chaos module, chosen by the store URL's descriptor.
pub(super) static CHAOS: ChaosBackend = ChaosBackend {
    descriptor: &dedup_redis::DESCRIPTOR,
    start: |dir, _| {
        let server = Redis::start(&dir.join("redis"))?;
        let url = server.url();
        let server = Mutex::new(server);
        Ok(StoreServer {
            url,
            restart: Some(Restart {
                name: "redis",
                crash_restart: Arc::new(move || {
                    server
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .kill_and_restart()
                }),
            }),
        })
    },
    transactional: None,
    failover: Some(failover),
};

/// [`ChaosBackend::failover`]: a primary and two replicas in `dir`, the store behind a
/// front on the primary (with `WAIT 1` after each commit for [`Replication::Sync`]).
fn failover(dir: &Path, replication: Replication) -> Result<StoreServer, BoxError> {
    let wait = match replication {
        Replication::Async => "",
        Replication::Sync => "?wait_replicas=1&wait_timeout=1s",
        Replication::RemoteApply => {
            return Err("remote-apply is PostgreSQL's; Redis runs async or sync (WAIT)".into());
        }
    };
    let primary = Redis::start_with(&dir.join("redis-primary"), &[])?;
    let of_primary = [
        "--replicaof".into(),
        "127.0.0.1".into(),
        primary.port.to_string(),
    ];
    let replicas = [
        Redis::start_with(&dir.join("redis-replica-1"), &of_primary)?,
        Redis::start_with(&dir.join("redis-replica-2"), &of_primary)?,
    ];
    for replica in &replicas {
        replica.wait_for_link()?;
    }
    let proxy = SwitchingProxy::start(SocketAddr::from(([127, 0, 0, 1], 0)), primary.addr())?;
    let url = format!("redis://{}/{wait}", proxy.addr());
    let servers = Mutex::new((primary, replicas));
    Ok(StoreServer {
        url,
        restart: Some(Restart {
            name: "failover",
            crash_restart: Arc::new(move || {
                let mut servers = servers.lock().unwrap_or_else(|p| p.into_inner());
                let (primary, replicas) = &mut *servers;
                primary.kill();
                let offsets = [replicas[0].replica_offset()?, replicas[1].replica_offset()?];
                let (new, other) = if offsets[0] >= offsets[1] {
                    (0, 1)
                } else {
                    (1, 0)
                };
                replicas[new].command(&["REPLICAOF", "NO", "ONE"])?;
                let port = replicas[new].port.to_string();
                replicas[other].command(&["REPLICAOF", "127.0.0.1", &port])?;
                proxy.switch(replicas[new].addr());
                Ok(())
            }),
        }),
    })
}

/// The server binary runs start: `DEDUP_CHAOS_REDIS_SERVER`, else `redis-server`.
fn server_binary() -> String {
    std::env::var("DEDUP_CHAOS_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

/// A private redis-server persisting every write (`appendfsync always`), killed when
/// dropped.
struct Redis {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
    /// More `redis-server` arguments (`--replicaof host port`).
    extra: Vec<String>,
}

impl Redis {
    /// Start one with its data in `dir`.
    fn start(dir: &Path) -> Result<Self, BoxError> {
        Redis::start_with(dir, &[])
    }

    /// Start one with its data in `dir` and `extra` arguments.
    fn start_with(dir: &Path, extra: &[String]) -> Result<Self, BoxError> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        std::fs::create_dir_all(dir)?;
        let mut server = Redis {
            child: None,
            dir: dir.to_path_buf(),
            port,
            extra: extra.to_vec(),
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> Result<(), BoxError> {
        let child = Command::new(server_binary())
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = redis::Client::open(self.url().as_str())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok();
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{} did not start in 30 s", server_binary()).into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL it and start it again on the same port and data (the AOF).
    fn kill_and_restart(&mut self) -> Result<(), BoxError> {
        self.kill();
        self.spawn()
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Run one command; its answer as text.
    fn command(&self, args: &[&str]) -> Result<String, BoxError> {
        let mut conn = redis::Client::open(self.url().as_str())?.get_connection()?;
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        Ok(match cmd.query::<redis::Value>(&mut conn)? {
            redis::Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            other => format!("{other:?}"),
        })
    }

    /// A field of `INFO replication`.
    fn replication_field(&self, name: &str) -> Result<String, BoxError> {
        let info = self.command(&["INFO", "replication"])?;
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_string())
            .ok_or_else(|| format!("no {name} in INFO replication of port {}", self.port).into())
    }

    /// A replica's replication offset (how much of the primary's stream it has).
    fn replica_offset(&self) -> Result<u64, BoxError> {
        Ok(self.replication_field("slave_repl_offset")?.parse()?)
    }

    /// Wait (up to 30 s) until a replica's link to its primary is up.
    fn wait_for_link(&self) -> Result<(), BoxError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.replication_field("master_link_status")? != "up" {
            if Instant::now() > deadline {
                return Err(format!("replica on port {} did not sync in 30 s", self.port).into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Its URL.
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
