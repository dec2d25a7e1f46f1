//! Redis Sentinel for the Redis failover runs: three private `redis-server --sentinel`
//! processes monitoring the run's primary (quorum 2, `down-after-milliseconds` 1000), so
//! that a killed primary is replaced by Sentinel's own election and promotion rather than
//! the harness's. Chosen with `DEDUP_CHAOS_REDIS_SENTINEL=1`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis_server::{RedisServer, server_binary};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The name the sentinels monitor the primary under.
const MASTER: &str = "dedup";

/// Whether the failover runs use Sentinel (`DEDUP_CHAOS_REDIS_SENTINEL=1`).
pub fn chosen() -> bool {
    std::env::var("DEDUP_CHAOS_REDIS_SENTINEL").is_ok_and(|v| v == "1")
}

/// The three sentinels; killed when dropped.
pub struct Sentinels {
    children: Vec<Child>,
    ports: Vec<u16>,
}

impl Sentinels {
    /// Start three sentinels in `dir` monitoring `primary`; returns when each knows
    /// `replicas` replicas and the two other sentinels. Blocking.
    pub fn start(dir: &Path, primary: &RedisServer, replicas: usize) -> Result<Self, BoxError> {
        let mut sentinels = Sentinels {
            children: Vec::new(),
            ports: Vec::new(),
        };
        for i in 0..3 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let conf = dir.join(format!("sentinel-{i}.conf"));
            std::fs::create_dir_all(dir)?;
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor {MASTER} 127.0.0.1 {} 2\n\
                     sentinel down-after-milliseconds {MASTER} 1000\n\
                     sentinel failover-timeout {MASTER} 10000\n",
                    dir.display(),
                    primary.port
                ),
            )?;
            let child = Command::new(server_binary())
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("starting {} --sentinel: {e}", server_binary()))?;
            sentinels.children.push(child);
            sentinels.ports.push(port);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        for &port in &sentinels.ports {
            loop {
                let known = master_field(port, "num-slaves").ok() == Some(replicas.to_string())
                    && master_field(port, "num-other-sentinels").ok() == Some("2".into());
                if known {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "sentinel on port {port} did not see {replicas} replicas and 2 \
                         sentinels within 60 s"
                    )
                    .into());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(sentinels)
    }

    /// Wait (up to 60 s) until the sentinels name a primary other than `old`; its address.
    pub fn wait_for_new_primary(&self, old: SocketAddr) -> Result<SocketAddr, BoxError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            for &port in &self.ports {
                if let Ok(addr) = primary_addr(port)
                    && addr != old
                {
                    return Ok(addr);
                }
            }
            if Instant::now() > deadline {
                return Err("Sentinel promoted no replica within 60 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn connection(port: u16) -> Result<redis::Connection, BoxError> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/").as_str())?;
    let conn = client.get_connection_with_timeout(Duration::from_secs(1))?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    Ok(conn)
}

/// A field of `SENTINEL MASTER dedup` on the sentinel at `port`.
fn master_field(port: u16, name: &str) -> Result<String, BoxError> {
    let fields: Vec<String> = redis::cmd("SENTINEL")
        .arg("MASTER")
        .arg(MASTER)
        .query(&mut connection(port)?)?;
    fields
        .chunks(2)
        .find(|kv| kv[0] == name)
        .and_then(|kv| kv.get(1).cloned())
        .ok_or_else(|| format!("no {name} in SENTINEL MASTER").into())
}

/// The primary the sentinel at `port` names.
fn primary_addr(port: u16) -> Result<SocketAddr, BoxError> {
    let (host, port): (String, u16) = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(MASTER)
        .query(&mut connection(port)?)?;
    Ok(format!("{host}:{port}").parse()?)
}
