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

/// Standalone server or Redis Cluster.
#[derive(Clone, Debug)]
pub enum Target {
    /// `DEDUP_REDIS_URL`.
    Standalone(String),
    /// `DEDUP_REDIS_CLUSTER_URLS` (comma-separated).
    Cluster(Vec<String>),
}

impl Target {
    pub fn standalone() -> Option<Self> {
        dedup_conformance::server_url("DEDUP_REDIS_URL").map(Target::Standalone)
    }

    pub fn cluster() -> Option<Self> {
        dedup_conformance::server_url("DEDUP_REDIS_CLUSTER_URLS").map(|urls| {
            Target::Cluster(
                urls.split(',')
                    .map(str::trim)
                    .filter(|u| !u.is_empty())
                    .map(str::to_owned)
                    .collect(),
            )
        })
    }

    /// Every available target; prints which are skipped.
    pub fn all(test: &str) -> Vec<Self> {
        let mut out = Vec::new();
        match Self::standalone() {
            Some(t) => out.push(t),
            None => eprintln!("SKIPPED {test} on standalone Redis: DEDUP_REDIS_URL is not set"),
        }
        match Self::cluster() {
            Some(t) => out.push(t),
            None => {
                eprintln!("SKIPPED {test} on Redis Cluster: DEDUP_REDIS_CLUSTER_URLS is not set")
            }
        }
        out
    }

    pub fn name(&self) -> &'static str {
        match self {
            Target::Standalone(_) => "standalone",
            Target::Cluster(_) => "cluster",
        }
    }

    /// The node URLs (one for standalone).
    pub fn node_urls(&self) -> Vec<String> {
        match self {
            Target::Standalone(u) => vec![u.clone()],
            Target::Cluster(urls) => urls.clone(),
        }
    }

    pub async fn open(&self, config: RedisConfig) -> RedisStore {
        match self {
            Target::Standalone(url) => RedisStore::connect_with(url, config).await,
            Target::Cluster(urls) => RedisStore::connect_cluster(urls, config).await,
        }
        .unwrap_or_else(|e| panic!("connecting to {self:?}: {e:?}"))
    }

    /// A raw connection for commands on single keys.
    pub async fn raw(&self) -> Raw {
        match self {
            Target::Standalone(url) => Raw::Standalone(
                redis::Client::open(url.as_str())
                    .expect("url")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("raw connection"),
            ),
            Target::Cluster(urls) => Raw::Cluster(
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
