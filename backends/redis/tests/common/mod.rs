//! What the Redis tests share: the servers (through `dedup_conformance::server_url`, so a
//! missing server skips with a message, or fails under `DEDUP_TEST_STRICT=1`), stores on a
//! fresh key prefix, and a raw connection for poking at keys behind the store's back.

#![allow(dead_code)] // each test binary uses its own subset

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dedup_core::{Clock, ManualClock};
use dedup_redis::redis::{self, Cmd, Value};
use dedup_redis::{RedisConfig, RedisStore};

/// Retention for test stores: far longer than any clock advance in the tests, so native and
/// logical expiry never interfere unless a test means them to.
pub const RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Which server: Redis (7.x here: every operation but a fresh-key claim is a script) or
/// Valkey (9.x: commits and renewals by the lease holder are one `SET ... IFEQ`). Every
/// test runs against both, so both paths keep one contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    Redis,
    Valkey,
}

impl Server {
    pub const ALL: [Server; 2] = [Server::Redis, Server::Valkey];

    pub fn name(self) -> &'static str {
        match self {
            Server::Redis => "Redis",
            Server::Valkey => "Valkey",
        }
    }

    /// The variable holding the standalone server's URL.
    pub fn standalone_var(self) -> &'static str {
        match self {
            Server::Redis => "DEDUP_REDIS_URL",
            Server::Valkey => "DEDUP_VALKEY_URL",
        }
    }

    /// The variable holding the cluster's node URLs (comma-separated).
    pub fn cluster_var(self) -> &'static str {
        match self {
            Server::Redis => "DEDUP_REDIS_CLUSTER_URLS",
            Server::Valkey => "DEDUP_VALKEY_CLUSTER_URLS",
        }
    }

    /// Whether its stores take the one-command (`SET ... IFEQ`) path.
    pub fn has_set_ifeq(self) -> bool {
        self == Server::Valkey
    }
}

/// A standalone server or a cluster, of Redis or Valkey.
#[derive(Clone, Debug)]
pub enum Target {
    /// `DEDUP_REDIS_URL` / `DEDUP_VALKEY_URL`.
    Standalone(Server, String),
    /// `DEDUP_REDIS_CLUSTER_URLS` / `DEDUP_VALKEY_CLUSTER_URLS` (comma-separated).
    Cluster(Server, Vec<String>),
}

impl Target {
    pub fn standalone(server: Server) -> Option<Self> {
        dedup_conformance::server_url(server.standalone_var())
            .map(|url| Target::Standalone(server, url))
    }

    pub fn cluster(server: Server) -> Option<Self> {
        dedup_conformance::server_url(server.cluster_var()).map(|urls| {
            Target::Cluster(
                server,
                urls.split(',')
                    .map(str::trim)
                    .filter(|u| !u.is_empty())
                    .map(str::to_owned)
                    .collect(),
            )
        })
    }

    /// Every available standalone server; prints which are skipped.
    pub fn standalones(test: &str) -> Vec<Self> {
        let mut out = Vec::new();
        for server in Server::ALL {
            match Self::standalone(server) {
                Some(t) => out.push(t),
                None => eprintln!(
                    "SKIPPED {test} on standalone {}: {} is not set",
                    server.name(),
                    server.standalone_var()
                ),
            }
        }
        out
    }

    /// Every available cluster; prints which are skipped.
    pub fn clusters(test: &str) -> Vec<Self> {
        let mut out = Vec::new();
        for server in Server::ALL {
            match Self::cluster(server) {
                Some(t) => out.push(t),
                None => eprintln!(
                    "SKIPPED {test} on {} Cluster: {} is not set",
                    server.name(),
                    server.cluster_var()
                ),
            }
        }
        out
    }

    /// Every available target; prints which are skipped.
    pub fn all(test: &str) -> Vec<Self> {
        let mut out = Self::standalones(test);
        out.extend(Self::clusters(test));
        out
    }

    pub fn server(&self) -> Server {
        match self {
            Target::Standalone(server, _) | Target::Cluster(server, _) => *server,
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Target::Cluster(..))
    }

    /// "standalone Redis", "Valkey cluster", ...
    pub fn name(&self) -> String {
        match self {
            Target::Standalone(server, _) => format!("standalone {}", server.name()),
            Target::Cluster(server, _) => format!("{} cluster", server.name()),
        }
    }

    /// The node URLs (one for standalone).
    pub fn node_urls(&self) -> Vec<String> {
        match self {
            Target::Standalone(_, u) => vec![u.clone()],
            Target::Cluster(_, urls) => urls.clone(),
        }
    }

    pub async fn open(&self, config: RedisConfig) -> RedisStore {
        match self {
            Target::Standalone(_, url) => RedisStore::connect_with(url, config).await,
            Target::Cluster(_, urls) => RedisStore::connect_cluster(urls, config).await,
        }
        .inspect(|store| {
            assert_eq!(
                store.uses_set_ifeq(),
                self.server().has_set_ifeq(),
                "{}: the store found SET ... IFEQ where it should not, or missed it",
                self.name()
            );
        })
        .unwrap_or_else(|e| panic!("connecting to {self:?}: {e:?}"))
    }

    /// A raw connection for commands on single keys.
    pub async fn raw(&self) -> Raw {
        match self {
            Target::Standalone(_, url) => Raw::Standalone(
                redis::Client::open(url.as_str())
                    .expect("url")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("raw connection"),
            ),
            Target::Cluster(_, urls) => Raw::Cluster(
                redis::cluster::ClusterClient::new(urls.clone())
                    .expect("cluster urls")
                    .get_async_connection()
                    .await
                    .expect("raw cluster connection"),
            ),
        }
    }
}

/// A raw connection (standalone or cluster).
pub enum Raw {
    Standalone(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Raw {
    pub async fn run(&mut self, cmd: &Cmd) -> Value {
        match self {
            Raw::Standalone(c) => cmd.query_async(c).await,
            Raw::Cluster(c) => cmd.query_async(c).await,
        }
        .unwrap_or_else(|e| panic!("{cmd:?}: {e:?}"))
    }
}

/// A key prefix no other test uses.
pub fn unique_prefix(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("t_{test}_{}_{nanos:x}_{n}:", std::process::id())
}

/// A config on a fresh prefix with `clock` and [`RETENTION`].
pub fn config(test: &str, clock: &Arc<ManualClock>) -> RedisConfig {
    RedisConfig {
        prefix: unique_prefix(test),
        retention: RETENTION,
        clock: Some(clock.clone() as Arc<dyn Clock>),
        ..RedisConfig::default()
    }
}

/// Counters of `INFO section` summed over the target's nodes, by name: the lines
/// `{line_prefix}NAME:...,{field}=N,...` (`cmdstat_set:calls=12,usec=...`,
/// `errorstat_MOVED:count=3`).
pub async fn info_counts(
    target: &Target,
    section: &str,
    line_prefix: &str,
    field: &str,
) -> HashMap<String, u64> {
    let field = format!("{field}=");
    let mut counts = HashMap::new();
    for url in target.node_urls() {
        let mut conn = redis::Client::open(url.as_str())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connection");
        let info: String = redis::cmd("INFO")
            .arg(section)
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("INFO {section}: {e:?}"));
        for line in info.lines() {
            let Some((name, stats)) = line
                .strip_prefix(line_prefix)
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let n: u64 = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix(field.as_str()))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            *counts.entry(name.to_owned()).or_default() += n;
        }
    }
    counts
}

/// `calls` per command over the target's nodes (`INFO commandstats`).
pub async fn command_calls(target: &Target) -> HashMap<String, u64> {
    info_counts(target, "commandstats", "cmdstat_", "calls").await
}

/// Between the two snapshots, each name of `expected` counted exactly that many more.
pub fn counts(
    before: &HashMap<String, u64>,
    after: &HashMap<String, u64>,
    expected: &[(&str, u64)],
    what: &str,
) {
    for &(name, n) in expected {
        let ran = after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
        assert_eq!(ran, n, "{what}: {name} counted {ran}, expected {n}");
    }
}
