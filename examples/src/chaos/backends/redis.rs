//! Redis in the chaos harness: the store lives in a private `redis-server` of the run
//! (`appendonly yes`, `appendfsync always`), SIGKILLed and restarted once. Lease mode
//! only: Redis has no transaction an effect row could join.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{BoxError, ChaosBackend, Restart, StoreServer};

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
    failover: None,
};

/// A private redis-server persisting every write (`appendfsync always`), killed when
/// dropped.
struct Redis {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
}

impl Redis {
    /// Start one with its data in `dir`.
    fn start(dir: &Path) -> Result<Self, BoxError> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        std::fs::create_dir_all(dir)?;
        let mut server = Redis {
            child: None,
            dir: dir.to_path_buf(),
            port,
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> Result<(), BoxError> {
        let child = Command::new("redis-server")
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
                return Err("redis-server did not start in 30 s".into());
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
