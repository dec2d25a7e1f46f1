//! Redis (standalone or Cluster): the store under a key prefix of its own, and the raw
//! baseline as plain `SET NX` / `SET XX` commands through the same kind of connection the
//! store uses (one multiplexed `ConnectionManager`, or a `ClusterConnection`).
//!
//! Nothing is deleted at the end: every key the bench writes expires by itself
//! ([`RETENTION`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dedup_core::{Clock, ManualClock, duration_millis};
use dedup_redis::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use dedup_redis::redis::cluster::ClusterClientBuilder;
use dedup_redis::redis::cluster_async::ClusterConnection;
use dedup_redis::redis::cluster_routing::Slot;
use dedup_redis::redis::{self, Cmd, Pipeline, RedisResult, Value};
use dedup_redis::{RedisConfig, RedisStore};
use futures::FutureExt;
use futures::future::{BoxFuture, try_join_all};

use super::target::{Raw, Target};
use super::{Bench, NOT_SHARED, Names, Result, token};

/// How long the bench's keys live: the store's retention and the raw keys' TTL.
const RETENTION: Duration = Duration::from_secs(600);

/// The purge store's retention: longer than the time its manual clock jumps ahead, so
/// the prefilled records are still there (by that clock) when purge runs.
const PURGE_STORE_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The key prefix part of the store as an application opens it ([`Names::redis_prefix`]).
pub(crate) const STORE_PART: &str = "lib";
/// The key prefix part of the purge store, on the manual clock.
pub(crate) const PURGE_PART: &str = "purge";

/// Where the servers are.
pub(crate) enum Servers {
    /// One standalone server.
    Standalone(String),
    /// The seed nodes of a cluster.
    Cluster(Vec<String>),
}

/// The server's name and version (`INFO server` of the first node): `(true, "9.1.2")` for
/// Valkey, `(false, "7.0.15")` for Redis.
async fn server_version(url: &str) -> Result<(bool, String)> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
    };
    Ok(match field("valkey_version") {
        Some(v) => (true, v),
        None => (false, field("redis_version").unwrap_or_default()),
    })
}
/// The Redis / Valkey bench (standalone or cluster), chosen by the store URL's descriptor.
pub(crate) static BENCH: Bench = Bench {
    descriptor: &dedup_redis::DESCRIPTOR,
    settings: false,
    open: |target, _, names, _| {
        async move {
            match target.downcast::<dedup_redis::RedisTarget>() {
                Ok(dedup_redis::RedisTarget::Standalone { url, .. }) => {
                    open(Servers::Standalone(url), names).await
                }
                Ok(dedup_redis::RedisTarget::Cluster { urls, .. }) => {
                    open(Servers::Cluster(urls), names).await
                }
                _ => Err(NOT_SHARED.into()),
            }
        }
        .boxed()
    },
    temporary: None,
};

/// Connect the store, the purge store and the baseline.
pub(crate) async fn open(servers: Servers, names: &Names) -> Result<Target> {
    let first = match &servers {
        Servers::Standalone(url) => url.clone(),
        Servers::Cluster(urls) => urls.first().cloned().unwrap_or_default(),
    };
    let (valkey, version) = server_version(&first).await?;
    let clock = Arc::new(ManualClock::starting_now());
    let config = RedisConfig {
        prefix: names.redis_prefix(STORE_PART),
        retention: RETENTION,
        ..RedisConfig::default()
    };
    let purge_config = RedisConfig {
        prefix: names.redis_prefix(PURGE_PART),
        retention: PURGE_STORE_RETENTION,
        clock: Some(Arc::clone(&clock) as Arc<dyn Clock>),
        ..RedisConfig::default()
    };
    let (backend, store, purge_store, conn) = match &servers {
        Servers::Standalone(url) => {
            let manager = ConnectionManager::new_with_config(
                redis::Client::open(url.as_str())?,
                ConnectionManagerConfig::new()
                    .set_response_timeout(config.response_timeout)
                    .set_max_delay(Duration::from_secs(1)),
            )
            .await?;
            (
                if valkey { "valkey" } else { "redis" },
                RedisStore::connect_with(url, config.clone()).await?,
                RedisStore::connect_with(url, purge_config).await?,
                RawConn::Standalone(manager),
            )
        }
        Servers::Cluster(urls) => {
            let mut builder = ClusterClientBuilder::new(urls.iter().map(String::as_str));
            if let Some(t) = config.response_timeout {
                builder = builder.response_timeout(t);
            }
            (
                if valkey {
                    "valkey-cluster"
                } else {
                    "redis-cluster"
                },
                RedisStore::connect_cluster(urls, config.clone()).await?,
                RedisStore::connect_cluster(urls, purge_config).await?,
                RawConn::Cluster(builder.build()?.get_async_connection().await?),
            )
        }
    };
    let mut setup = format!(
        "{} {version}; {}",
        if valkey { "Valkey" } else { "Redis" },
        match conn {
            RawConn::Standalone(_) => "one multiplexed connection (store and raw)",
            RawConn::Cluster(_) => "cluster connection (store and raw), one pipeline per slot",
        }
    );
    // The purge's SCAN walks every key of the server, not only the run's prefix: keys left
    // by earlier runs (each leaves its records, and its stream's) slow the purge and lengthen
    // the claims' wait behind it, so the header says how many there were.
    if let RawConn::Standalone(manager) = &conn {
        let keys: u64 = redis::cmd("DBSIZE")
            .query_async(&mut manager.clone())
            .await?;
        setup.push_str(&format!("; {keys} keys on the server before the run"));
    }
    // Valkey >= 8.1 / Redis >= 8.4: the holder's commits and renewals are one plain command.
    if store.uses_set_ifeq() {
        setup.push_str("; commit and renew by SET ... IFEQ (no script)");
    }
    let raw = RedisRaw {
        inner: Arc::new(Inner {
            conn,
            prefix: names.redis_prefix("raw"),
            ttl_ms: duration_millis(RETENTION),
        }),
    };
    Ok(Target {
        backend,
        store: Arc::new(store),
        purge_store: Arc::new(purge_store),
        clock,
        raw: Arc::new(raw),
        tx: None,
        setup,
    })
}

#[derive(Clone)]
enum RawConn {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl RawConn {
    async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            RawConn::Standalone(c) => cmd.query_async(&mut c.clone()).await,
            RawConn::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }

    async fn query_pipeline(&self, pipe: &Pipeline) -> RedisResult<Vec<Value>> {
        match self {
            RawConn::Standalone(c) => pipe.query_async(&mut c.clone()).await,
            RawConn::Cluster(c) => pipe.query_async(&mut c.clone()).await,
        }
    }

    /// Run `cmds` as pipelines: one, or one per hash slot on a cluster (sent at once).
    async fn pipelines(&self, cmds: Vec<(String, Cmd)>) -> RedisResult<Vec<Value>> {
        let groups: Vec<Vec<Cmd>> = match self {
            RawConn::Standalone(_) => vec![cmds.into_iter().map(|(_, c)| c).collect()],
            RawConn::Cluster(_) => {
                let mut by_slot: HashMap<Slot, Vec<Cmd>> = HashMap::new();
                for (key, cmd) in cmds {
                    by_slot.entry(Slot::for_key(&key)).or_default().push(cmd);
                }
                by_slot.into_values().collect()
            }
        };
        let replies = try_join_all(groups.into_iter().map(|cmds| async move {
            let mut pipe = redis::pipe();
            for cmd in cmds {
                pipe.add_command(cmd);
            }
            self.query_pipeline(&pipe).await
        }))
        .await?;
        Ok(replies.into_iter().flatten().collect())
    }
}

/// The raw baseline.
struct RedisRaw {
    inner: Arc<Inner>,
}

struct Inner {
    conn: RawConn,
    prefix: String,
    ttl_ms: i64,
}

impl Inner {
    fn key(&self, consumer: &str, message_id: &str) -> String {
        format!("{}{consumer}:{message_id}", self.prefix)
    }

    /// `SET key value NX|XX PX ttl`: the claim (`NX`) or the commit (`XX`).
    fn set(&self, key: &str, value: &str, condition: &str) -> Cmd {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key)
            .arg(value)
            .arg(condition)
            .arg("PX")
            .arg(self.ttl_ms);
        cmd
    }
}

fn expect_ok(what: &str, values: &[Value]) -> Result<()> {
    match values.iter().find(|v| !matches!(v, Value::Okay)) {
        None => Ok(()),
        Some(other) => Err(format!("raw {what} replied {other:?}, expected OK").into()),
    }
}

impl Raw for RedisRaw {
    fn claim_commit(
        &self,
        _worker: usize,
        consumer: Arc<str>,
        message_id: String,
    ) -> BoxFuture<'static, Result<bool>> {
        let inner = Arc::clone(&self.inner);
        async move {
            let key = inner.key(&consumer, &message_id);
            let token = token();
            let claimed = inner
                .conn
                .query(&inner.set(&key, &format!("i:{token}"), "NX"))
                .await?;
            if matches!(claimed, Value::Nil) {
                // The key exists: a duplicate.
                return Ok(false);
            }
            expect_ok("SET NX", &[claimed])?;
            let committed = inner
                .conn
                .query(&inner.set(&key, &format!("c:{token}"), "XX"))
                .await?;
            expect_ok("SET XX", &[committed])?;
            Ok(true)
        }
        .boxed()
    }

    fn batch(
        &self,
        _worker: usize,
        consumer: Arc<str>,
        message_ids: Vec<String>,
    ) -> BoxFuture<'static, Result<()>> {
        let inner = Arc::clone(&self.inner);
        async move {
            let keys: Vec<(String, String)> = message_ids
                .iter()
                .map(|id| (inner.key(&consumer, id), token()))
                .collect();
            for (condition, state) in [("NX", "i"), ("XX", "c")] {
                let cmds = keys
                    .iter()
                    .map(|(key, token)| {
                        let cmd = inner.set(key, &format!("{state}:{token}"), condition);
                        (key.clone(), cmd)
                    })
                    .collect();
                let replies = inner.conn.pipelines(cmds).await?;
                expect_ok(&format!("SET {condition}"), &replies)?;
            }
            Ok(())
        }
        .boxed()
    }

    fn cleanup(&self) -> BoxFuture<'static, Result<()>> {
        // Every key expires by itself (RETENTION).
        async { Ok(()) }.boxed()
    }
}
