//! [`RedisStore`]: the [`DedupStore`](dedup_core::DedupStore) over Redis (standalone or Cluster).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::backend::Storage;
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, Error, ItemResult, Key, Lease,
    LeaseToken, Record, Result, duration_millis,
};

use crate::conn::{BatchReply, Call, Conn};
use crate::error::{ReplicationShortfall, backend};
use crate::scripts::{CLAIM, CLAIM_MANY, COMMIT, COMMIT_MANY, GET, Lua, RELEASE, RENEW};
use crate::{RedisConfig, layout, reply};

/// A [`DedupStore`](dedup_core::DedupStore) keeping one Redis hash per key, every operation one Lua script.
///
/// Works against a standalone server ([`connect`](Self::connect),
/// [`connect_with`](Self::connect_with)) or a Redis Cluster
/// ([`connect_cluster`](Self::connect_cluster)); the behaviour is the same. Cheap to clone:
/// clones share the underlying multiplexed connection(s). See the crate docs for the key
/// layout, retention, durability and cluster notes.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    config: Arc<RedisConfig>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("mode", &self.conn)
            .field("config", &self.config)
            .finish()
    }
}

impl RedisStore {
    /// Connect to a standalone server (`redis://[user:password@]host:port[/db]`) with
    /// [`RedisConfig::default`]. The connection reconnects by itself after a drop.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RedisConfig::default()).await
    }

    /// Connect to a standalone server with `config`. A Redis Cluster node is refused
    /// ([`Error::InvalidInput`]): use [`connect_cluster`](Self::connect_cluster).
    pub async fn connect_with(url: &str, config: RedisConfig) -> Result<Self> {
        config.validate()?;
        let conn = crate::connect::standalone(url, &config).await?;
        Self::open(conn, config).await
    }

    /// Connect to a Redis Cluster through any of its nodes' URLs (the rest of the topology
    /// is discovered, and followed through slot moves and failovers). `rediss://` node URLs
    /// connect with TLS.
    pub async fn connect_cluster(urls: &[String], config: RedisConfig) -> Result<Self> {
        config.validate()?;
        if urls.is_empty() {
            return Err(Error::invalid(
                "cluster urls",
                "at least one node URL is needed",
            ));
        }
        let conn = crate::connect::cluster(urls, &config).await?;
        Self::open(conn, config).await
    }

    async fn open(conn: Conn, config: RedisConfig) -> Result<Self> {
        // Loading the scripts up front checks the connection and saves the first calls a
        // NOSCRIPT round trip.
        conn.load_scripts()
            .await
            .map_err(|e| backend(e).during("loading the scripts"))?;
        Ok(RedisStore {
            conn,
            config: Arc::new(config),
        })
    }

    /// The configuration this store was opened with.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// Whether this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.conn.is_cluster()
    }

    /// The Redis key holding `key`'s record (see the crate docs, "Key layout"). For
    /// operators and tests; never write to it yourself.
    pub fn redis_key(&self, key: &Key) -> String {
        layout::redis_key(&self.config.prefix, key)
    }

    /// `ARGV[1]` of every script: the injected clock's ms, or empty for the server's TIME.
    pub(crate) fn now_arg(&self) -> String {
        self.config
            .clock
            .as_ref()
            .map(|c| c.now().as_millis().to_string())
            .unwrap_or_default()
    }

    fn retention_ms(&self) -> i64 {
        duration_millis(self.config.retention)
    }

    pub(crate) fn conn(&self) -> &Conn {
        &self.conn
    }

    fn claim_call(&self, key: &Key, options: &ClaimOptions, now: &str) -> (Call, LeaseToken) {
        let token = LeaseToken::random();
        let fingerprint = options.fingerprint.as_ref().map_or("", |f| f.as_str());
        // lua/one.lua: the batch's shared arguments (conn::SHARED_ARGS) first.
        let call = Call::new(&CLAIM, self.redis_key(key))
            .arg(now)
            .arg(self.retention_ms())
            .arg(token.to_string())
            .arg(duration_millis(options.lease))
            .arg(fingerprint);
        (call, token)
    }

    fn commit_call(&self, lease: &Lease, outcome: Option<&[u8]>, now: &str) -> Call {
        // lua/one.lua: the batch's shared arguments (conn::SHARED_ARGS) first.
        Call::new(&COMMIT, self.redis_key(&lease.key))
            .arg(now)
            .arg(self.retention_ms())
            .arg(lease.token.to_string())
            .arg(if outcome.is_some() { "1" } else { "0" })
            .arg(outcome.unwrap_or_default())
    }

    fn lease_call(&self, lua: &'static Lua, lease: &Lease) -> Call {
        Call::new(lua, self.redis_key(&lease.key))
            .arg(self.now_arg())
            .arg(lease.token.to_string())
    }

    /// Run commits (one script call per batch, or per slot group in a cluster) with the
    /// configured replica wait; the shortfall check applies when at least one commit
    /// succeeded (a lost lease wrote nothing to wait for).
    async fn run_commits(&self, calls: &[Call], leases: &[&Lease]) -> Result<Vec<Result<()>>> {
        let BatchReply {
            values,
            acknowledged,
        } = self
            .conn
            .eval_batch(&COMMIT_MANY, calls, self.config.wait_for_replicas)
            .await
            .map_err(backend)?;
        let results: Vec<Result<()>> = leases
            .iter()
            .zip(values)
            .map(|(lease, v)| reply::commit(lease, v))
            .collect();
        if let (Some((wanted, _)), Some(acked)) = (self.config.wait_for_replicas, acknowledged)
            && acked < i64::from(wanted)
            && results.iter().any(Result::is_ok)
        {
            return Err(ReplicationShortfall {
                wanted,
                acknowledged: u32::try_from(acked.max(0)).unwrap_or(0),
            }
            .into_error());
        }
        Ok(results)
    }
}

dedup_core::impl_dedup_store!(RedisStore);

#[async_trait]
impl Storage for RedisStore {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        let (call, token) = self.claim_call(key, options, &self.now_arg());
        let value = self.conn.eval(&call).await.map_err(backend)?;
        reply::claim(key, token, value)
    }

    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        let now = self.now_arg();
        let (calls, tokens): (Vec<Call>, Vec<LeaseToken>) = requests
            .iter()
            .map(|r| self.claim_call(&r.key, &r.options, &now))
            .unzip();
        let batch = self
            .conn
            .eval_batch(&CLAIM_MANY, &calls, None)
            .await
            .map_err(backend)?;
        Ok(requests
            .iter()
            .zip(tokens)
            .zip(batch.values)
            .map(|((r, token), v)| reply::claim(&r.key, token, v))
            .collect())
    }

    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        let call = self
            .lease_call(&RENEW, lease)
            .arg(duration_millis(extend_by))
            .arg(self.retention_ms());
        let value = self.conn.eval(&call).await.map_err(backend)?;
        reply::renew(lease, value)
    }

    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        let call = self.commit_call(lease, outcome, &self.now_arg());
        if self.config.wait_for_replicas.is_none() {
            let value = self.conn.eval(&call).await.map_err(backend)?;
            return reply::commit(lease, value);
        }
        let mut results = self.run_commits(&[call], &[lease]).await?;
        results.pop().unwrap_or(Ok(()))
    }

    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        let now = self.now_arg();
        let calls: Vec<Call> = requests
            .iter()
            .map(|r| self.commit_call(&r.lease, r.outcome.as_deref(), &now))
            .collect();
        let leases: Vec<&Lease> = requests.iter().map(|r| &r.lease).collect();
        self.run_commits(&calls, &leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let call = self.lease_call(&RELEASE, lease).arg(self.retention_ms());
        let value = self.conn.eval(&call).await.map_err(backend)?;
        reply::release(lease, value)
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        let call = Call::new(&GET, self.redis_key(key)).arg(self.now_arg());
        let value = self.conn.eval(&call).await.map_err(backend)?;
        reply::get(key, value)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            persistent: true,
            multi_process: true,
            native_batch: true,
            native_ttl: true,
            server_clock: self.config.clock.is_none(),
            ..Capabilities::default()
        }
    }
}
