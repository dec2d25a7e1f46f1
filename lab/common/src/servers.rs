//! The run's private servers from `scripts/services.sh` (crash-restartable): any of its
//! services, by name ([`Service`]); the PostgreSQL of the chaos queue and the servers of
//! the outbox story (PostgreSQL or MariaDB, RabbitMQ, Kafka) by their own names. Private, so that restarting them disturbs nothing
//! else on the machine. (A backend's own store server is started by its chaos module.)

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `scripts/services.sh` of this repository.
fn services_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services.sh")
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
/// dropped.
pub struct Service {
    dir: PathBuf,
    name: &'static str,
    /// Its URL.
    pub url: String,
    /// Its `services.sh env` lines.
    env: String,
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
            env: String::new(),
        };
        services(dir, &["start", name])?;
        let env = services(dir, &["env"])?;
        server.env = String::from_utf8_lossy(&env.stdout).into_owned();
        server.url = server.var(url_var)?;
        Ok(server)
    }

    /// The value of the `services.sh env` line exporting `var`.
    pub fn var(&self, var: &str) -> Result<String, BoxError> {
        let prefix = format!("export {var}=");
        self.env
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map(|v| v.trim_matches(|c| c == '\'' || c == '"').to_string())
            .ok_or_else(|| format!("no {var} in {}", self.env).into())
    }

    /// Crash the server and start it again on its data (PostgreSQL: an immediate stop, no
    /// checkpoint; other services: `SIGKILL`); returns when it accepts connections.
    pub fn crash_restart(&self) -> Result<(), BoxError> {
        services(&self.dir, &["crash-restart", self.name]).map(|_| ())
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = services(&self.dir, &["stop"]);
    }
}

/// A private PostgreSQL (the chaos queue's server, and the outbox story's).
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

/// A private MariaDB (the outbox story's store under `--chaos-store mariadb`).
#[cfg(feature = "mysql")]
pub struct MariaDb;

#[cfg(feature = "mysql")]
impl MariaDb {
    /// Start one with its state in `dir`.
    pub fn start(dir: &Path) -> Result<Service, BoxError> {
        Service::start(dir, "mariadb", "DEDUP_MYSQL_URL")
    }

    /// Flush InnoDB's log at every commit: the scripts' server trades durability for speed
    /// (`innodb_flush_log_at_trx_commit = 2`), and a chaos run must not lose commits.
    pub async fn commit_durably(admin: &dedup_mysql::sqlx::MySqlPool) -> Result<(), BoxError> {
        dedup_mysql::sqlx::raw_sql("SET GLOBAL innodb_flush_log_at_trx_commit = 1")
            .execute(admin)
            .await?;
        Ok(())
    }
}

/// A private primary with a replica of it, for the failover runs: `services.sh start
/// postgres-replica` (a streaming standby) or `mariadb-replica` (a GTID replica).
pub struct ReplicaPair {
    service: Service,
    /// The replica's URL (the primary's is [`ReplicaPair::primary_url`]).
    pub standby_url: String,
}

impl ReplicaPair {
    /// A PostgreSQL primary and a streaming standby with their state in `dir`
    /// (asynchronous replication).
    pub fn postgres(dir: &Path) -> Result<Self, BoxError> {
        Self::start(
            dir,
            "postgres-replica",
            "DEDUP_POSTGRES_PRIMARY_URL",
            "DEDUP_POSTGRES_STANDBY_URL",
        )
    }

    /// A MariaDB primary and a replica with their state in `dir` (asynchronous
    /// replication, both flushing their logs at every commit).
    pub fn mariadb(dir: &Path) -> Result<Self, BoxError> {
        Self::start(
            dir,
            "mariadb-replica",
            "DEDUP_MYSQL_PRIMARY_URL",
            "DEDUP_MYSQL_REPLICA_URL",
        )
    }

    fn start(
        dir: &Path,
        name: &'static str,
        primary_var: &str,
        standby_var: &str,
    ) -> Result<Self, BoxError> {
        let service = Service::start(dir, name, primary_var)?;
        let standby_url = service.var(standby_var)?;
        Ok(ReplicaPair {
            service,
            standby_url,
        })
    }

    /// The primary's URL.
    pub fn primary_url(&self) -> &str {
        &self.service.url
    }

    /// SIGKILL the primary and promote the replica; returns when the replica takes writes.
    pub fn promote(&self) -> Result<(), BoxError> {
        services(&self.service.dir, &["promote", self.service.name]).map(|_| ())
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

/// A private Kafka: Tansu on S3 storage (`services.sh`'s `kafka-durable`), so its topics,
/// records and committed group offsets survive [`Service::crash_restart`] (a SIGKILL of the
/// broker).
pub struct Kafka;

impl Kafka {
    /// Start one with its state in `dir`.
    pub fn start(dir: &Path) -> Result<Service, BoxError> {
        Service::start(dir, "kafka-durable", "DEDUP_KAFKA_DURABLE_BROKERS")
    }
}
