//! A private `redis-server` of a chaos run (`appendonly yes`, `appendfsync always`),
//! SIGKILLed when dropped: standalone for the Redis chaos module's runs, a cluster node
//! for the cluster partition scenario (bound to a veth address, started inside a network
//! namespace through a command prefix).
//!
//! The binary is `redis-server`, or the one `DEDUP_CHAOS_REDIS_SERVER` names (a
//! `valkey-server`, for Valkey's figures: `scripts/services.sh start valkey` fetches one).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The server binary runs start: `DEDUP_CHAOS_REDIS_SERVER`, else `redis-server`.
pub fn server_binary() -> String {
    std::env::var("DEDUP_CHAOS_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

/// One private server, killed when dropped.
pub struct RedisServer {
    child: Option<Child>,
    dir: PathBuf,
    bind: Ipv4Addr,
    /// Its port.
    pub port: u16,
    /// The command the server is started through (`ip netns exec NAME`), or none.
    prefix: Vec<String>,
    /// More `redis-server` arguments (`--replicaof host port`, `--cluster-enabled yes`).
    extra: Vec<String>,
}

impl RedisServer {
    /// Start one on 127.0.0.1 with its data in `dir` and `extra` arguments.
    pub fn start(dir: &Path, extra: &[String]) -> Result<Self, BoxError> {
        Self::start_on(dir, Ipv4Addr::LOCALHOST, &[], extra)
    }

    /// Start one bound to `bind`, through the command `prefix` (empty: directly), with its
    /// data in `dir` and `extra` arguments. Its port, and that port + 10000 (a cluster
    /// node's bus), are free on this host's loopback when it is chosen.
    pub fn start_on(
        dir: &Path,
        bind: Ipv4Addr,
        prefix: &[&str],
        extra: &[String],
    ) -> Result<Self, BoxError> {
        std::fs::create_dir_all(dir)?;
        let mut server = RedisServer {
            child: None,
            dir: dir.to_path_buf(),
            bind,
            port: free_port()?,
            prefix: prefix.iter().map(|s| s.to_string()).collect(),
            extra: extra.to_vec(),
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> Result<(), BoxError> {
        let mut command = match self.prefix.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(server_binary());
                command
            }
            None => Command::new(server_binary()),
        };
        let child = command
            .args([
                "--bind",
                &self.bind.to_string(),
                "--port",
                &self.port.to_string(),
            ])
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
            .spawn()
            .map_err(|e| format!("starting {}: {e}", server_binary()))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.command(&["PING"]).is_err() {
            if Instant::now() > deadline {
                return Err(format!(
                    "{} on {} did not start in 30 s",
                    server_binary(),
                    self.addr()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// SIGKILL it and start it again on the same port and data (the AOF).
    pub fn kill_and_restart(&mut self) -> Result<(), BoxError> {
        self.kill();
        self.spawn()
    }

    /// SIGKILL it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((IpAddr::V4(self.bind), self.port))
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr())
    }

    /// Run one command (a second at most to connect); its answer as text.
    pub fn command(&self, args: &[&str]) -> Result<String, BoxError> {
        let client = redis::Client::open(self.url().as_str())?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(1))?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        Ok(match cmd.query::<redis::Value>(&mut conn)? {
            redis::Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            redis::Value::SimpleString(s) => s,
            other => format!("{other:?}"),
        })
    }

    /// A field of `INFO section` (`replication`, `cluster`) or of `CLUSTER INFO`
    /// (`section` = `cluster-info`).
    pub fn info_field(&self, section: &str, name: &str) -> Result<String, BoxError> {
        let info = match section {
            "cluster-info" => self.command(&["CLUSTER", "INFO"])?,
            _ => self.command(&["INFO", section])?,
        };
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_string())
            .ok_or_else(|| format!("no {name} in {section} of {}", self.addr()).into())
    }

    /// A replica's replication offset (how much of the primary's stream it has).
    pub fn replica_offset(&self) -> Result<u64, BoxError> {
        Ok(self
            .info_field("replication", "slave_repl_offset")?
            .parse()?)
    }

    /// Wait (up to 30 s) until a replica's link to its primary is up.
    pub fn wait_for_link(&self) -> Result<(), BoxError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.info_field("replication", "master_link_status")? != "up" {
            if Instant::now() > deadline {
                return Err(format!("replica {} did not sync in 30 s", self.addr()).into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port free on the loopback, with port + 10000 free too (a cluster node's bus).
fn free_port() -> Result<u16, BoxError> {
    for _ in 0..100 {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return Ok(port);
        }
    }
    Err("no free port with its port + 10000 free in 100 tries".into())
}
