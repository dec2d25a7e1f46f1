//! [`RedisStore`]: the [`DedupStore`](dedup_core::DedupStore) over Redis (standalone or Cluster).

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::backend::Storage;
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, Error, ItemResult, Key, Lease,
    LeaseToken, Record, Result, Timestamp, duration_millis,
};
use redis::{Cmd, RedisResult, Value};
use tokio::sync::OnceCell;

use crate::RedisConfig;
use crate::conn::Conn;
use crate::connect::Connector;
use crate::decode::Swap;
use crate::decode::{self, fresh::Fresh};
use crate::error::{ReplicationShortfall, backend, refused};
use crate::held::{self, Held};
use crate::pipeline::BatchReply;
use crate::schema::{self, FreshClaim, InFlight, Times};
use crate::scripts::{CLAIM, CLAIM_MANY, COMMIT, COMMIT_MANY, Call, GET, Lua, RELEASE, RENEW};

/// A [`DedupStore`](dedup_core::DedupStore) keeping one Redis string per key (a packed
/// record): a fresh-key claim is one `SET ... NX PX ... GET`, every other operation one Lua
/// script.
///
/// Works against a standalone server ([`connect`](Self::connect),
/// [`connect_with`](Self::connect_with)) or a Redis Cluster
/// ([`connect_cluster`](Self::connect_cluster)); the behaviour is the same. Cheap to clone:
/// clones share the underlying multiplexed connection(s). See the crate docs for the key
/// layout, retention, durability and cluster notes.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    /// Opens the purge's connection.
    connector: Arc<Connector>,
    /// The purge's own connection, opened at the first purge batch and shared by clones.
    purge_conn: Arc<OnceCell<Conn>>,
    config: Arc<RedisConfig>,
    /// With a server that takes `SET ... IFEQ` (found when connecting): the values written
    /// for the leases this store handed out, for one-command commits and renewals
    /// ([`crate::held`]). `None`: every such operation is a script.
    held: Option<Arc<Held>>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("mode", &self.conn)
            .field("config", &self.config)
            .field("set_ifeq", &self.held.is_some())
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
        let (conn, connector) = crate::connect::standalone(url, &config).await?;
        Self::open(conn, connector, config).await
    }

    /// Connect to a Redis Cluster through any of its nodes' URLs (the rest of the topology
    /// is discovered, and followed through slot moves and failovers). `rediss://` node URLs
    /// connect with TLS.
    pub async fn connect_cluster(urls: &[String], config: RedisConfig) -> Result<Self> {
        config.validate()?;
        let (conn, connector) = crate::connect::cluster(urls, &config).await?;
        Self::open(conn, connector, config).await
    }

    async fn open(conn: Conn, connector: Connector, config: RedisConfig) -> Result<Self> {
        // Loading the scripts up front checks the connection and saves the first calls a
        // NOSCRIPT round trip.
        conn.load_scripts()
            .await
            .map_err(|e| backend(e).during("loading the scripts"))?;
        let set_ifeq = held::probe(&conn, &config.prefix)
            .await
            .map_err(|e| backend(e).during("asking whether the server takes SET ... IFEQ"))?;
        Ok(RedisStore {
            conn,
            connector: Arc::new(connector),
            purge_conn: Arc::new(OnceCell::new()),
            config: Arc::new(config),
            held: set_ifeq.then(|| Arc::new(Held::default())),
        })
    }

    /// Whether the server takes `SET ... IFEQ` (Valkey >= 8.1, Redis >= 8.4), found when
    /// connecting: a lease this store handed out is then committed and renewed (and, with an
    /// injected clock, released) by one plain command instead of a script. The behaviour is
    /// the same either way.
    pub fn uses_set_ifeq(&self) -> bool {
        self.held.is_some()
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
        schema::redis_key(&self.config.prefix, key)
    }

    /// The injected clock's time; `None` with the server's clock.
    fn clock_now(&self) -> Option<Timestamp> {
        self.config.clock.as_ref().map(|c| c.now())
    }

    /// `ARGV[1]` of every script: the injected clock's ms, or empty for the server's TIME.
    pub(crate) fn now_arg(&self) -> String {
        now_arg(self.clock_now())
    }

    fn retention_ms(&self) -> i64 {
        duration_millis(self.config.retention)
    }

    /// A test hook, only with the `test-hooks` feature (not part of the API: enabled by this
    /// crate's own tests through its dev-dependency on itself): make the cached cluster slot
    /// map wrong on purpose (every slot is taken for the next primary's), so that the next
    /// batch reaches the wrong nodes, is redirected, runs the redirected commands again
    /// through the cluster client and reads the map again. Nothing on a standalone server.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub async fn misroute_slots(&self) -> Result<()> {
        self.conn.misroute().await.map_err(backend)
    }

    pub(crate) fn conn(&self) -> &Conn {
        &self.conn
    }

    /// The purge's connection, apart from the one live operations share: a purge's `SCAN`s
    /// and pipelines then never queue in front of claims in the client (the server still
    /// runs every client's commands on its one thread, so purge batches stay small).
    /// Opened at the first purge and kept.
    pub(crate) async fn purge_conn(&self) -> Result<&Conn> {
        self.purge_conn
            .get_or_try_init(|| self.connector.open())
            .await
    }

    fn claim_call(&self, key: &Key, options: &ClaimOptions, now: &str, token: LeaseToken) -> Call {
        let fingerprint = options.fingerprint.as_ref().map_or("", |f| f.as_str());
        // lua/one.lua: the batch's shared arguments (scripts::SHARED_ARGS) first.
        Call::new(&CLAIM, self.redis_key(key))
            .arg(now)
            .arg(self.retention_ms())
            .arg(token.to_string())
            .arg(duration_millis(options.lease))
            .arg(fingerprint)
    }

    fn commit_call(&self, lease: &Lease, outcome: Option<&[u8]>, now: &str) -> Call {
        // lua/one.lua: the batch's shared arguments (scripts::SHARED_ARGS) first.
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

    /// Run commits (one script call per batch; in a cluster one per slot, one pipeline per
    /// primary) with the configured replica wait; the shortfall check applies when at least
    /// one commit succeeded (a lost lease wrote nothing to wait for).
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
            .map(|(lease, v)| decode::commit(lease, v))
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

/// One-command operations by the lease holder ([`crate::held`]): `Ok(None)` when the
/// script must run instead (the store does not remember the lease's value, the server has
/// no `IFEQ`, the key holds something else).
impl RedisStore {
    /// The value this store wrote for `lease`, with its Redis key, if it remembers it and
    /// it is not past its retention by the injected clock (`now`).
    fn held_value(&self, lease: &Lease, now: Option<i64>) -> Option<(&Held, String, InFlight)> {
        let held = self.held.as_deref()?;
        let key = self.redis_key(&lease.key);
        let record = held.get(lease.token, &key)?;
        if let (Some(now), Times::Absolute { retain_until, .. }) = (now, record.times)
            && retain_until <= now
        {
            // Absent by the store's clock: the script says so (LeaseLost).
            held.remove(lease.token);
            return None;
        }
        Some((held, key, record))
    }

    /// Send `SET ... IFEQ` (`cmds[0]`, alone or first of a transaction) and read what the
    /// key held; `Ok(None)` when the server refused the command (the script runs instead).
    async fn swap(&self, cmds: &[Cmd], expected: &[u8]) -> Result<Option<(Swap, Vec<Value>)>> {
        let replies = if let [cmd] = cmds {
            self.conn.query::<Value>(cmd).await.map(|v| vec![v])
        } else {
            let mut pipe = redis::pipe();
            pipe.atomic();
            for cmd in cmds {
                pipe.add_command(cmd.clone());
            }
            self.conn.query_pipeline(&pipe).await
        };
        match replies {
            Ok(replies) => match replies.first() {
                Some(Value::ServerError(_)) => Ok(None),
                Some(first) => Ok(Some((decode::swap(first, expected), replies))),
                None => Ok(None),
            },
            Err(e) if refused(&e) => Ok(None),
            Err(e) => Err(backend(e)),
        }
    }

    /// The one-command commit of `lease` at `now` (the injected clock's), if this store
    /// remembers its value.
    fn commit_swap(
        &self,
        lease: &Lease,
        outcome: Option<&[u8]>,
        now: Option<i64>,
    ) -> Option<Swapping> {
        let (_, key, record) = self.held_value(lease, now)?;
        let retention_ms = self.retention_ms();
        let expected = record.value();
        let cmd = schema::set_ifeq(
            &key,
            &record.committed(now, retention_ms, outcome),
            expected.as_bytes(),
            retention_ms,
        );
        Some(Swapping { key, cmd, expected })
    }

    async fn commit_by_swap(
        &self,
        lease: &Lease,
        outcome: Option<&[u8]>,
    ) -> Result<Option<Result<()>>> {
        let now = self.clock_now().map(Timestamp::as_millis);
        let (Some(held), Some(s)) = (self.held.as_deref(), self.commit_swap(lease, outcome, now))
        else {
            return Ok(None);
        };
        let answer = self.swap(&[s.cmd], s.expected.as_bytes()).await?;
        held.remove(lease.token);
        Ok(answer.and_then(|(swap, _)| committed_by_swap(lease, swap)))
    }

    async fn renew_by_swap(
        &self,
        lease: &Lease,
        extend_by: Duration,
    ) -> Result<Option<Result<Lease>>> {
        let now = self.clock_now().map(Timestamp::as_millis);
        let Some((held, key, record)) = self.held_value(lease, now) else {
            return Ok(None);
        };
        let retention_ms = self.retention_ms();
        let extend_ms = duration_millis(extend_by);
        let renewed = InFlight {
            times: match now {
                // The server sets the key's expiry from its own "now"; PEXPIRETIME, in the
                // same transaction, gives the lease's expiry back exactly.
                None => Times::Relative {
                    lease_ms: extend_ms,
                    retention_ms,
                },
                Some(now) => {
                    let expires_at = now.saturating_add(extend_ms);
                    Times::Absolute {
                        expires_at,
                        retain_until: expires_at.saturating_add(retention_ms),
                    }
                }
            },
            ..record.clone()
        };
        let value = record.value();
        let mut cmds = vec![schema::set_ifeq(
            &key,
            renewed.value().as_bytes(),
            value.as_bytes(),
            renewed.ttl_ms(now),
        )];
        if now.is_none() {
            let mut expiry = redis::cmd("PEXPIRETIME");
            expiry.arg(&key);
            cmds.push(expiry);
        }
        let answer = self.swap(&cmds, value.as_bytes()).await?;
        let (swap, replies) = match answer {
            Some(answer) => answer,
            None => {
                held.remove(lease.token);
                return Ok(None);
            }
        };
        let expires_at = match (swap, renewed.times) {
            (Swap::Written, Times::Absolute { expires_at, .. }) => expires_at,
            (Swap::Written, Times::Relative { .. }) => {
                match decode::fresh::key_expiry(replies.get(1)) {
                    Some(at) => at.saturating_sub(retention_ms),
                    None => {
                        return Err(Error::corrupt(
                            &lease.key,
                            "a renewed lease without an expiry",
                        ));
                    }
                }
            }
            (Swap::Absent, _) => {
                held.remove(lease.token);
                return Ok(Some(Err(Error::LeaseLost {
                    key: lease.key.clone(),
                })));
            }
            (Swap::Other, _) => {
                held.remove(lease.token);
                return Ok(None);
            }
        };
        held.insert(&key, renewed.clone());
        Ok(Some(Ok(Lease {
            key: lease.key.clone(),
            token: lease.token,
            fence: renewed.fence,
            attempt: renewed.attempt,
            expires_at: Timestamp::from_millis(expires_at),
        })))
    }

    /// With an injected clock only: on the server's clock a release ends the lease at the
    /// earlier of its expiry and the server's "now", which takes the script.
    async fn release_by_swap(&self, lease: &Lease) -> Result<Option<Result<()>>> {
        let Some(now) = self.clock_now().map(Timestamp::as_millis) else {
            return Ok(None);
        };
        let Some((held, key, record)) = self.held_value(lease, Some(now)) else {
            return Ok(None);
        };
        let Times::Absolute { expires_at, .. } = record.times else {
            return Ok(None);
        };
        let expires_at = expires_at.min(now);
        let released = InFlight {
            times: Times::Absolute {
                expires_at,
                retain_until: expires_at.saturating_add(self.retention_ms()),
            },
            ..record.clone()
        };
        let value = record.value();
        let cmd = schema::set_ifeq(
            &key,
            released.value().as_bytes(),
            value.as_bytes(),
            released.ttl_ms(Some(now)),
        );
        let answer = self.swap(&[cmd], value.as_bytes()).await?;
        Ok(match answer {
            Some((Swap::Written, _)) => {
                held.insert(&key, released);
                Some(Ok(()))
            }
            Some((Swap::Absent, _)) => {
                held.remove(lease.token);
                Some(Err(Error::LeaseLost {
                    key: lease.key.clone(),
                }))
            }
            Some((Swap::Other, _)) | None => {
                held.remove(lease.token);
                None
            }
        })
    }
}

/// A one-command commit: its key, the `SET ... IFEQ` and the value it expects.
struct Swapping {
    key: String,
    cmd: Cmd,
    expected: String,
}

/// A commit's answer from what its `SET ... IFEQ` found; `None`: the script decides.
fn committed_by_swap(lease: &Lease, swap: Swap) -> Option<Result<()>> {
    match swap {
        Swap::Written => Some(Ok(())),
        Swap::Absent => Some(Err(Error::LeaseLost {
            key: lease.key.clone(),
        })),
        Swap::Other => None,
    }
}

/// `ARGV[1]` of every script for `now`: its ms, or empty for the server's TIME.
fn now_arg(now: Option<Timestamp>) -> String {
    now.map(|t| t.as_millis().to_string()).unwrap_or_default()
}

impl RedisStore {
    /// Settle a fresh-key claim of `key` (at `redis_key`) from its replies (see
    /// [`fresh_replies`]): answered (an acquired lease's record is then remembered for the
    /// one-command commit, renewal and release), or left for the claim script.
    fn settle_fresh(
        &self,
        key: &Key,
        redis_key: &str,
        options: &ClaimOptions,
        fresh: &FreshClaim,
        now: Option<Timestamp>,
        (set, expiry): (RedisResult<Value>, Option<Value>),
    ) -> Result<Fresh> {
        let key_expiry = decode::fresh::key_expiry(expiry.as_ref());
        let expires_at = fresh.expires_at(key_expiry);
        let token = fresh.record.token;
        let answer =
            decode::fresh::fresh_claim(key, token, options, expires_at, now, key_expiry, set)?;
        if let (Some(held), Fresh::Answered(Ok(Claim::Acquired(_)))) = (&self.held, &answer) {
            held.insert(redis_key, fresh.record.clone());
        }
        Ok(answer)
    }
}

/// The replies to one [`FreshClaim`]'s commands, taken in order from `replies`: the `SET`'s,
/// and the `PEXPIRETIME`'s when it was sent.
fn fresh_replies(
    key: &Key,
    fresh: &FreshClaim,
    replies: &mut impl Iterator<Item = RedisResult<Value>>,
) -> Result<(RedisResult<Value>, Option<Value>)> {
    let Some(set) = replies.next() else {
        return Err(Error::corrupt(key, "no reply to SET"));
    };
    let expiry = match fresh.expiry {
        Some(_) => replies.next().transpose().map_err(backend)?,
        None => None,
    };
    Ok((set, expiry))
}

#[async_trait]
impl Storage for RedisStore {
    /// A fresh key is claimed by `SET ... NX PX ... GET` alone (no script); a completed
    /// record it answers with settles the claim too. Anything else runs the claim script.
    ///
    /// [`claim_many`](Self::claim_many)'s steps for one item, without a batch's
    /// bookkeeping (request copies, per-item vectors, the slot plan): a single claim is the
    /// hot path, and its client-side work shows in the throughput at high concurrency.
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        let now = self.clock_now();
        let redis_key = self.redis_key(key);
        let token = LeaseToken::random();
        let fresh = schema::fresh_claim(&redis_key, token, options, self.retention_ms(), now);
        let mut replies = self
            .conn
            .run_on_key(redis_key.as_bytes(), fresh.cmds())
            .await
            .map_err(backend)?
            .into_iter();
        let answer = fresh_replies(key, &fresh, &mut replies)?;
        match self.settle_fresh(key, &redis_key, options, &fresh, now, answer)? {
            Fresh::Answered(claim) => claim,
            Fresh::Script => {
                let call = self.claim_call(key, options, &now_arg(now), token);
                let batch = self
                    .conn
                    .eval_batch(&CLAIM_MANY, std::slice::from_ref(&call), None)
                    .await
                    .map_err(backend)?;
                match batch.values.into_iter().next() {
                    Some(v) => decode::claim(key, token, v),
                    None => Err(Error::corrupt(key, "no reply")),
                }
            }
        }
    }

    /// One pipeline of fresh-key claims (`SET ... NX PX ... GET`, and `PEXPIRETIME` with the
    /// server's clock; per primary in a cluster): a fresh key is claimed without a script,
    /// and a completed record it answers with settles the claim too. Then one claim script
    /// call (per slot) for the items it did not settle. Once an item of a key goes to the
    /// script, every later item of that key does too, so a repeated key sees its earlier
    /// items' writes in order.
    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        let now = self.clock_now();
        let retention_ms = self.retention_ms();
        let keys: Vec<String> = requests.iter().map(|r| self.redis_key(&r.key)).collect();
        let tokens: Vec<LeaseToken> = requests.iter().map(|_| LeaseToken::random()).collect();
        let fresh: Vec<FreshClaim> = requests
            .iter()
            .zip(&keys)
            .zip(&tokens)
            .map(|((r, k), &t)| schema::fresh_claim(k, t, &r.options, retention_ms, now))
            .collect();
        let cmds: Vec<(&[u8], Cmd)> = keys
            .iter()
            .zip(&fresh)
            .flat_map(|(k, f)| f.cmds().map(move |c| (k.as_bytes(), c.clone())))
            .collect();
        let mut replies = self
            .conn
            .run_keyed(&cmds)
            .await
            .map_err(backend)?
            .into_iter();
        let mut results: Vec<Option<ItemResult<Claim>>> = Vec::with_capacity(requests.len());
        let mut scripted: HashSet<&str> = HashSet::new();
        let mut to_script = Vec::new();
        for (i, f) in fresh.iter().enumerate() {
            let r = &requests[i];
            let answer = fresh_replies(&r.key, f, &mut replies)?;
            let answer = if scripted.contains(keys[i].as_str()) {
                Fresh::Script
            } else {
                self.settle_fresh(&r.key, &keys[i], &r.options, f, now, answer)?
            };
            results.push(match answer {
                Fresh::Answered(claim) => Some(claim),
                Fresh::Script => {
                    scripted.insert(&keys[i]);
                    to_script.push(i);
                    None
                }
            });
        }
        if !to_script.is_empty() {
            let now = now_arg(now);
            let calls: Vec<Call> = to_script
                .iter()
                .map(|&i| self.claim_call(&requests[i].key, &requests[i].options, &now, tokens[i]))
                .collect();
            let batch = self
                .conn
                .eval_batch(&CLAIM_MANY, &calls, None)
                .await
                .map_err(backend)?;
            for (&i, v) in to_script.iter().zip(batch.values) {
                results[i] = Some(decode::claim(&requests[i].key, tokens[i], v));
            }
        }
        Ok(results
            .into_iter()
            .zip(requests)
            .map(|(r, req)| {
                r.unwrap_or_else(|| Err(Error::corrupt(&req.key, "no reply for this item")))
            })
            .collect())
    }

    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        if let Some(answer) = self.renew_by_swap(lease, extend_by).await? {
            return answer;
        }
        let call = self
            .lease_call(&RENEW, lease)
            .arg(duration_millis(extend_by))
            .arg(self.retention_ms());
        let value = self.conn.eval(&call).await.map_err(backend)?;
        decode::renew(lease, value)
    }

    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        if self.config.wait_for_replicas.is_none()
            && let Some(answer) = self.commit_by_swap(lease, outcome).await?
        {
            return answer;
        }
        let call = self.commit_call(lease, outcome, &self.now_arg());
        if self.config.wait_for_replicas.is_none() {
            let value = self.conn.eval(&call).await.map_err(backend)?;
            return decode::commit(lease, value);
        }
        let mut results = self.run_commits(&[call], &[lease]).await?;
        results.pop().unwrap_or(Ok(()))
    }

    /// The leases this store remembers the values of commit by one `SET ... IFEQ` each, all
    /// in one pipeline (per primary); the rest, and those whose key held something else,
    /// then run as one script call (per slot). A commit's answer does not depend on the
    /// order of the batch's items (only the holder's token commits; the same lease twice is
    /// `Ok` twice), so the pipeline running first changes no item's result.
    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        let mut results: Vec<Option<ItemResult<()>>> = requests.iter().map(|_| None).collect();
        if self.config.wait_for_replicas.is_none()
            && let Some(held) = self.held.as_deref()
        {
            let now = self.clock_now().map(Timestamp::as_millis);
            let swaps: Vec<(usize, Swapping)> = requests
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    Some((i, self.commit_swap(&r.lease, r.outcome.as_deref(), now)?))
                })
                .collect();
            if !swaps.is_empty() {
                let cmds: Vec<(&[u8], Cmd)> = swaps
                    .iter()
                    .map(|(_, s)| (s.key.as_bytes(), s.cmd.clone()))
                    .collect();
                let replies = self.conn.run_keyed(&cmds).await.map_err(backend)?;
                for ((i, s), reply) in swaps.iter().zip(replies) {
                    let lease = &requests[*i].lease;
                    held.remove(lease.token);
                    results[*i] = match reply {
                        Ok(v) => committed_by_swap(lease, decode::swap(&v, s.expected.as_bytes())),
                        Err(e) if refused(&e) => None,
                        Err(e) => return Err(backend(e)),
                    };
                }
            }
        }
        let rest: Vec<usize> = (0..requests.len())
            .filter(|&i| results[i].is_none())
            .collect();
        if !rest.is_empty() {
            let now = self.now_arg();
            let calls: Vec<Call> = rest
                .iter()
                .map(|&i| {
                    self.commit_call(&requests[i].lease, requests[i].outcome.as_deref(), &now)
                })
                .collect();
            let leases: Vec<&Lease> = rest.iter().map(|&i| &requests[i].lease).collect();
            for (&i, result) in rest.iter().zip(self.run_commits(&calls, &leases).await?) {
                results[i] = Some(result);
            }
        }
        Ok(results
            .into_iter()
            .zip(requests)
            .map(|(r, req)| {
                r.unwrap_or_else(|| Err(Error::corrupt(&req.lease.key, "no reply for this item")))
            })
            .collect())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        if let Some(answer) = self.release_by_swap(lease).await? {
            return answer;
        }
        let call = self.lease_call(&RELEASE, lease).arg(self.retention_ms());
        let value = self.conn.eval(&call).await.map_err(backend)?;
        decode::release(lease, value)
    }

    /// Always the release script, given the encoded failure: it writes the record as layout
    /// 3 (see the crate's README), which the one-command paths never compare equal, so the
    /// value remembered for this lease is forgotten first.
    async fn release_failed(&self, lease: &Lease, failure: &dedup_core::Failure) -> Result<()> {
        if let Some(held) = self.held.as_deref() {
            held.remove(lease.token);
        }
        let call = self
            .lease_call(&RELEASE, lease)
            .arg(self.retention_ms())
            .arg(failure.encode());
        let value = self.conn.eval(&call).await.map_err(backend)?;
        decode::release(lease, value)
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        let call = Call::new(&GET, self.redis_key(key)).arg(self.now_arg());
        let value = self.conn.eval(&call).await.map_err(backend)?;
        decode::get(key, value)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            persistent: true,
            multi_process: true,
            native_batch: true,
            native_ttl: true,
            server_clock: self.config.clock.is_none(),
            failure_causes: true,
            ..Capabilities::default()
        }
    }
}
