//! The run's private servers: PostgreSQL, MariaDB and RabbitMQ from `scripts/services.sh`
//! (crash-restartable) and a `redis-server` with `appendonly yes`, `appendfsync always` (SIGKILL and restart).
//! Private, so that restarting them disturbs nothing else on the machine.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `scripts/services.sh` of this repository.
fn services_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/services.sh")
}

fn services(dir: &Path, args: &[&str]) -> Result<Output, BoxError> {
    let out = Command::new(services_script())
        .args(args)
        .env("DEDUP_SERVICES_DIR", dir)
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "services.sh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(out)
}

/// A private server from `scripts/services.sh` in a state dir of its own, stopped when
/// dropped: PostgreSQL, MariaDB or RabbitMQ.
pub struct Service {
    dir: PathBuf,
    name: &'static str,
    /// Its URL.
    pub url: String,
}

impl Service {
    /// Start `name` with its state in `dir`; its URL is the `url_var` line of
    /// `services.sh env`.
    pub fn start(dir: &Path, name: &'static str, url_var: &str) -> Result<Self, BoxError> {
        // Built first, so that a start failing halfway is stopped by `drop`.
        let mut server = Service {
            dir: dir.to_path_buf(),
            name,
            url: String::new(),
        };
        services(dir, &["start", name])?;
        let env = services(dir, &["env"])?;
        let env = String::from_utf8_lossy(&env.stdout).into_owned();
        let prefix = format!("export {url_var}=");
        server.url = env
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map(|v| v.trim_matches(|c| c == '\'' || c == '"').to_string())
            .ok_or_else(|| format!("no {url_var} in {env}"))?;
        Ok(server)
    }

    /// Crash the server and start it again on its data (PostgreSQL: an immediate stop, no
    /// checkpoint; MariaDB and RabbitMQ: `SIGKILL`); returns when it accepts connections.
    pub fn crash_restart(&self) -> Result<(), BoxError> {
        services(&self.dir, &["crash-restart", self.name]).map(|_| ())
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = services(&self.dir, &["stop"]);
    }
}

/// A private PostgreSQL.
pub struct Postgres;

impl Postgres {
    /// Start one with its state in `dir`.
    pub fn start(dir: &Path) -> Result<Service, BoxError> {
        Service::start(dir, "postgres", "DEDUP_POSTGRES_URL")
    }

    /// Turn `synchronous_commit` back on: the scripts' servers trade durability for speed,
    /// and a crash-restart must not lose commits in a chaos run.
    pub async fn commit_durably(admin: &dedup_postgres::sqlx::PgPool) -> Result<(), BoxError> {
        for statement in [
            "ALTER SYSTEM SET synchronous_commit = on",
            "SELECT pg_reload_conf()",
        ] {
            dedup_postgres::sqlx::raw_sql(statement)
                .execute(admin)
                .await?;
        }
        Ok(())
    }
}

/// A private MariaDB.
#[cfg(feature = "mysql")]
pub struct MariaDb;

#[cfg(feature = "mysql")]
impl MariaDb {
    /// Start one with its state in `dir`.
    pub fn start(dir: &Path) -> Result<Service, BoxError> {
        Service::start(dir, "mariadb", "DEDUP_MYSQL_URL")
    }
}

/// A private RabbitMQ (its queues and confirmed persistent messages survive
/// [`Service::crash_restart`]).
pub struct RabbitMq;

impl RabbitMq {
    /// Start one with its state in `dir`.
    pub fn start(dir: &Path) -> Result<Service, BoxError> {
        Service::start(dir, "rabbitmq", "DEDUP_AMQP_URL")
    }
}

/// A private redis-server persisting every write (`appendfsync always`), killed when
/// dropped.
pub struct Redis {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
}

impl Redis {
    /// Start one with its data in `dir`.
    pub fn start(dir: &Path) -> Result<Self, BoxError> {
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
    pub fn kill_and_restart(&mut self) -> Result<(), BoxError> {
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
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
