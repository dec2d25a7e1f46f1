//! [`RedisStore`]: the [`DedupStore`](dedup_core::DedupStore) over Redis (standalone or
//! Cluster): the type, its constructors and accessors here; its
//! [`Storage`](dedup_core::backend::Storage) implementation in [`storage`], the script calls
//! it builds in [`calls`], the holder's one-command operations in [`one_command`].

use std::fmt;
use std::sync::Arc;

use dedup_core::{Key, Result, Timestamp, duration_millis};
use tokio::sync::OnceCell;

use crate::RedisConfig;
use crate::conn::Conn;
use crate::connect::Connector;
use crate::error::backend;
use crate::held::{self, Held};
use crate::schema;

mod calls;
mod one_command;
mod storage;

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
    /// ([`Error::InvalidInput`](dedup_core::Error::InvalidInput)): use
    /// [`connect_cluster`](Self::connect_cluster).
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

    /// A test hook, only with the `test-hooks` feature (not part of the API): `token` as
    /// this version writes it into records (Z85, 20 characters), for tests that read the
    /// stored value.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn stored_token(token: dedup_core::LeaseToken) -> String {
        crate::token::text(token)
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
}

/// `ARGV[1]` of every script for `now`: its ms, or empty for the server's TIME.
fn now_arg(now: Option<Timestamp>) -> String {
    now.map(|t| t.as_millis().to_string()).unwrap_or_default()
}
