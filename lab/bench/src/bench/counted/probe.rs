//! The server's own counters, read on a connection of the probe's own (not through the
//! counting proxy): statements or commands, transaction commits, log flushes, and the
//! CPU time of the server's processes when the server runs on this machine.
//!
//! | backend | statements | commits | log flushes | server processes |
//! | --- | --- | --- | --- | --- |
//! | PostgreSQL | n/a (no `pg_stat_statements` needed) | `pg_stat_database` `xact_commit` | `pg_stat_wal.wal_sync` | the postmaster of `pg_backend_pid()` and its children |
//! | MySQL / MariaDB | `Questions` | `Handler_commit` | `Innodb_os_log_fsyncs` (MariaDB 10.8+: `Innodb_data_fsyncs`, every InnoDB fsync) | the pid in `@@pid_file` |
//! | MariaDB Galera | the same, of the URL's node | the same, of the URL's node | the same, of the URL's node | every node's `@@pid_file` (`wsrep_incoming_addresses`) |
//! | Redis / Valkey | `INFO stats` `total_commands_processed` | n/a | n/a (`appendfsync` as configured) | `INFO server` `process_id` |
//! | NATS KV | n/a | n/a | n/a (`sync_interval` as configured) | every node's `nats-server`: the listeners of the URL's servers and of the `connect_urls` they announce |
//!
//! Every figure is the whole server's: run the counted bench on a server of its own.

use std::time::Duration;

use futures::future::BoxFuture;

use super::cpu::Server;
use crate::bench::Result;

/// One reading of a server's counters (cumulative since the server started).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Reading {
    /// Statements or commands the server ran.
    pub(crate) statements: Option<f64>,
    /// Transactions committed.
    pub(crate) commits: Option<f64>,
    /// Log flushes (`fsync` / `fdatasync` of the write-ahead or redo log).
    pub(crate) log_flushes: Option<f64>,
    /// CPU time of the server's processes.
    pub(crate) cpu: Option<Duration>,
}

fn minus(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? - b?)
}

impl Reading {
    /// What happened between `before` and `self`.
    pub(crate) fn since(&self, before: &Reading) -> Reading {
        Reading {
            statements: minus(self.statements, before.statements),
            commits: minus(self.commits, before.commits),
            log_flushes: minus(self.log_flushes, before.log_flushes),
            cpu: self.cpu.zip(before.cpu).map(|(a, b)| a.saturating_sub(b)),
        }
    }

    /// `self` less what the probe's own reading costs (`overhead`, counted once).
    pub(crate) fn less(&self, overhead: &Reading) -> Reading {
        let less = |a: Option<f64>, o: Option<f64>| a.map(|a| (a - o.unwrap_or(0.0)).max(0.0));
        Reading {
            statements: less(self.statements, overhead.statements),
            commits: less(self.commits, overhead.commits),
            log_flushes: less(self.log_flushes, overhead.log_flushes),
            cpu: self.cpu,
        }
    }
}

/// Reads one server's counters.
pub(crate) trait Probe: Send + Sync {
    /// The counters now.
    fn read(&self) -> BoxFuture<'_, Result<Reading>>;
    /// What the probe reads, for the setup line.
    fn describe(&self) -> String;
}

/// No server (SQLite: the whole cost is the client's).
pub(crate) struct NoServer;

impl Probe for NoServer {
    fn read(&self) -> BoxFuture<'_, Result<Reading>> {
        Box::pin(async { Ok(Reading::default()) })
    }
    fn describe(&self) -> String {
        "no server: every cost is the client's".into()
    }
}

/// The probe of the server `url` names (`None`: no server counters for that scheme).
pub(crate) async fn open(url: &str) -> Result<Box<dyn Probe>> {
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Box::new(postgres::PgProbe::open(url).await?));
    }
    #[cfg(feature = "mysql")]
    if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        return Ok(Box::new(mysql::MySqlProbe::open(url).await?));
    }
    #[cfg(feature = "redis")]
    if url.starts_with("redis://") {
        return Ok(Box::new(redis::RedisProbe::open(url).await?));
    }
    #[cfg(feature = "nats-kv")]
    if url.starts_with("nats-kv://") {
        return Ok(Box::new(nats::NatsProbe::open(url).await?));
    }
    let _ = url;
    Ok(Box::new(NoServer))
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::time::Duration;

    use dedup_postgres::sqlx::{self, Connection, PgConnection};
    use futures::future::BoxFuture;
    use tokio::sync::Mutex;

    use super::{Probe, Reading, Server};
    use crate::bench::Result;

    /// How long a backend may keep its statistics before it reports them (PostgreSQL
    /// flushes an idle backend's counters at most once a second).
    const STATS_FLUSH: Duration = Duration::from_millis(1_100);

    pub(crate) struct PgProbe {
        conn: Mutex<PgConnection>,
        server: Option<Server>,
    }

    impl PgProbe {
        pub(crate) async fn open(url: &str) -> Result<Self> {
            let mut conn = PgConnection::connect(url).await?;
            let (backend,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
                .fetch_one(&mut conn)
                .await?;
            let server = super::super::cpu::parent(backend as u32).map(Server::Tree);
            Ok(PgProbe {
                conn: Mutex::new(conn),
                server,
            })
        }
    }

    impl Probe for PgProbe {
        fn read(&self) -> BoxFuture<'_, Result<Reading>> {
            Box::pin(async move {
                tokio::time::sleep(STATS_FLUSH).await;
                let mut conn = self.conn.lock().await;
                let (commits, flushes): (i64, i64) = sqlx::query_as(
                    "SELECT (SELECT xact_commit FROM pg_stat_database \
                             WHERE datname = current_database()), \
                            (SELECT wal_sync FROM pg_stat_wal)",
                )
                .fetch_one(&mut *conn)
                .await?;
                Ok(Reading {
                    statements: None,
                    commits: Some(commits as f64),
                    log_flushes: Some(flushes as f64),
                    cpu: self.server.and_then(|s| s.cpu()),
                })
            })
        }

        fn describe(&self) -> String {
            match self.server {
                Some(s) => format!("server CPU of postmaster {} and its children", s.pid()),
                None => "server CPU: n/a (the server is not on this machine)".into(),
            }
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use dedup_mysql::sqlx::{self, Connection, MySqlConnection};
    use futures::future::BoxFuture;
    use tokio::sync::Mutex;

    use super::{Probe, Reading, Server};
    use crate::bench::Result;

    pub(crate) struct MySqlProbe {
        conn: Mutex<MySqlConnection>,
        /// The server's process; a Galera cluster's: every node's (`None` where one is
        /// not on this machine).
        servers: Vec<Option<Server>>,
        flush_at_commit: String,
        galera: bool,
    }

    impl MySqlProbe {
        pub(crate) async fn open(url: &str) -> Result<Self> {
            let mut conn = MySqlConnection::connect(url).await?;
            let flush = flush_at_commit(&mut conn).await?;
            let mut servers = vec![server_of(&mut conn).await?];
            // A Galera node: every node's CPU, since each applies every write.
            let nodes = crate::bench::mysql::galera_nodes(&mut conn).await?;
            for node in nodes.iter().flat_map(|n| n.split(',')) {
                let Some(node_url) = with_address(url, node) else {
                    continue;
                };
                let mut other = MySqlConnection::connect(&node_url).await?;
                let server = server_of(&mut other).await?;
                // The URL's own node is listed too.
                if !servers
                    .iter()
                    .any(|s| s.map(|s| s.pid()) == server.map(|s| s.pid()))
                {
                    servers.push(server);
                }
            }
            Ok(MySqlProbe {
                conn: Mutex::new(conn),
                servers,
                flush_at_commit: flush,
                galera: nodes.is_some(),
            })
        }
    }

    async fn flush_at_commit(conn: &mut MySqlConnection) -> Result<String> {
        Ok(
            sqlx::query_scalar("SELECT CAST(@@innodb_flush_log_at_trx_commit AS CHAR)")
                .fetch_one(conn)
                .await?,
        )
    }

    /// The server process of the connection (`@@pid_file`), when it runs on this machine.
    async fn server_of(conn: &mut MySqlConnection) -> Result<Option<Server>> {
        let pid_file: String = sqlx::query_scalar("SELECT @@pid_file")
            .fetch_one(conn)
            .await?;
        Ok(std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .map(Server::Process))
    }

    /// `url` with its `host:port` replaced by `address`.
    fn with_address(url: &str, address: &str) -> Option<String> {
        let start = url.find("://")? + 3;
        let end = url[start..]
            .find(['/', '?'])
            .map_or(url.len(), |i| start + i);
        let host = url[start..end].rfind('@').map_or(start, |i| start + i + 1);
        Some(format!("{}{}{}", &url[..host], address.trim(), &url[end..]))
    }

    impl Probe for MySqlProbe {
        fn read(&self) -> BoxFuture<'_, Result<Reading>> {
            Box::pin(async move {
                let mut conn = self.conn.lock().await;
                let rows: Vec<(String, String)> = sqlx::query_as(
                    "SHOW GLOBAL STATUS WHERE Variable_name IN \
                     ('Questions', 'Handler_commit', 'Innodb_os_log_fsyncs', 'Innodb_data_fsyncs')",
                )
                .fetch_all(&mut *conn)
                .await?;
                let get = |name: &str| {
                    rows.iter()
                        .find(|(n, _)| n.eq_ignore_ascii_case(name))
                        .and_then(|(_, v)| v.parse::<f64>().ok())
                };
                Ok(Reading {
                    statements: get("Questions"),
                    commits: get("Handler_commit"),
                    // MariaDB 10.8+ has no log-only counter: all of InnoDB's fsyncs.
                    log_flushes: get("Innodb_os_log_fsyncs").or_else(|| get("Innodb_data_fsyncs")),
                    cpu: self.servers.iter().map(|s| s.and_then(|s| s.cpu())).sum(),
                })
            })
        }

        fn describe(&self) -> String {
            let pids: Option<Vec<String>> = self
                .servers
                .iter()
                .map(|s| s.map(|s| s.pid().to_string()))
                .collect();
            let cpu = match (pids, self.galera) {
                (Some(pids), false) => format!("server CPU of mariadbd {}", pids.join(", ")),
                (Some(pids), true) => format!(
                    "counters of the URL's node, server CPU of the {} Galera nodes' mariadbd {}",
                    pids.len(),
                    pids.join(", ")
                ),
                (None, _) => "server CPU: n/a (a server is not on this machine)".into(),
            };
            format!(
                "innodb_flush_log_at_trx_commit={}, {cpu}",
                self.flush_at_commit
            )
        }
    }
}

#[cfg(feature = "redis")]
mod redis {
    use dedup_redis::redis::{self, aio::MultiplexedConnection};
    use futures::future::BoxFuture;
    use tokio::sync::Mutex;

    use super::{Probe, Reading, Server};
    use crate::bench::Result;

    pub(crate) struct RedisProbe {
        conn: Mutex<MultiplexedConnection>,
        server: Option<Server>,
        persistence: String,
    }

    /// The value of `field` in an `INFO` reply.
    fn field(info: &str, field: &str) -> Option<String> {
        info.lines().find_map(|line| {
            let (name, value) = line.trim().split_once(':')?;
            (name == field).then(|| value.to_owned())
        })
    }

    async fn info(conn: &mut MultiplexedConnection, section: &str) -> Result<String> {
        Ok(redis::cmd("INFO")
            .arg(section)
            .query_async::<String>(conn)
            .await?)
    }

    impl RedisProbe {
        pub(crate) async fn open(url: &str) -> Result<Self> {
            let mut conn = redis::Client::open(url)?
                .get_multiplexed_async_connection()
                .await?;
            let server_info = info(&mut conn, "server").await?;
            let server = field(&server_info, "process_id")
                .and_then(|p| p.parse().ok())
                .map(Server::Process);
            let persistence = info(&mut conn, "persistence").await?;
            let persistence = format!(
                "aof_enabled={}",
                field(&persistence, "aof_enabled").unwrap_or_default()
            );
            Ok(RedisProbe {
                conn: Mutex::new(conn),
                server,
                persistence,
            })
        }
    }

    impl Probe for RedisProbe {
        fn read(&self) -> BoxFuture<'_, Result<Reading>> {
            Box::pin(async move {
                let mut conn = self.conn.lock().await;
                let stats = info(&mut conn, "stats").await?;
                Ok(Reading {
                    statements: field(&stats, "total_commands_processed")
                        .and_then(|v| v.parse().ok()),
                    commits: None,
                    log_flushes: None,
                    cpu: self.server.and_then(|s| s.cpu()),
                })
            })
        }

        fn describe(&self) -> String {
            let cpu = match self.server {
                Some(s) => format!("server CPU of process {}", s.pid()),
                None => "server CPU: n/a (the server is not on this machine)".into(),
            };
            format!("{}, {cpu}", self.persistence)
        }
    }
}

#[cfg(feature = "nats-kv")]
mod nats {
    use async_nats::ServerAddr;
    use dedup_nats_kv::NatsKvTarget;
    use futures::future::BoxFuture;

    use super::{Probe, Reading, Server};
    use crate::bench::Result;
    use crate::bench::counted::cpu::listener_of;

    /// The CPU of a NATS server or cluster: every node's `nats-server`.
    pub(crate) struct NatsProbe {
        /// `None` where a node is not on this machine.
        servers: Vec<Option<Server>>,
    }

    impl NatsProbe {
        pub(crate) async fn open(url: &str) -> Result<Self> {
            let target = dedup::StoreUrl::parse(url)?
                .into_target()
                .downcast::<NatsKvTarget>()
                .map_err(|_| "not a NATS KV URL")?;
            let addrs = target
                .servers
                .iter()
                .map(|s| s.parse::<ServerAddr>())
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let client = async_nats::connect(addrs).await?;
            // The URL's servers, and the cluster's other nodes as they announce themselves.
            let mut nodes: Vec<String> = target
                .servers
                .iter()
                .map(|s| s.rsplit_once('@').map_or(s.as_str(), |(_, a)| a).to_owned())
                .collect();
            nodes.extend(
                client
                    .server_info()
                    .connect_urls
                    .iter()
                    .map(|u| format!("nats://{u}")),
            );
            let mut servers: Vec<Option<Server>> = Vec::new();
            for node in nodes {
                let server = listener_of(&node).map(Server::Process);
                if !servers
                    .iter()
                    .any(|s| s.map(|s| s.pid()) == server.map(|s| s.pid()))
                {
                    servers.push(server);
                }
            }
            Ok(NatsProbe { servers })
        }
    }

    impl Probe for NatsProbe {
        fn read(&self) -> BoxFuture<'_, Result<Reading>> {
            Box::pin(async move {
                Ok(Reading {
                    statements: None,
                    commits: None,
                    log_flushes: None,
                    cpu: self.servers.iter().map(|s| s.and_then(|s| s.cpu())).sum(),
                })
            })
        }

        fn describe(&self) -> String {
            let pids: Option<Vec<String>> = self
                .servers
                .iter()
                .map(|s| s.map(|s| s.pid().to_string()))
                .collect();
            match pids {
                Some(pids) => format!("server CPU of nats-server {}", pids.join(", ")),
                None => "server CPU: n/a (a server is not on this machine)".into(),
            }
        }
    }
}
