//! The one connection the store logic talks through, and single calls on it: a standalone
//! server behind a [`ConnectionManager`] (multiplexed, reconnects by itself) or a Redis
//! Cluster behind a [`ClusterConnection`] (multiplexed per node, follows slot moves and
//! failovers) with the primaries' map and connections of [`Primaries`] for batches.
//!
//! Everything the store does is an `EVALSHA` of one of [`crate::scripts`] on one key
//! ([`Call`]), sent alone ([`Conn::eval`], here) or in pipelines ([`crate::pipeline`]:
//! script calls, and plain commands on single keys such as the fresh-key claims); and
//! `SCAN` and keyless scripts on each node for admin and purge ([`crate::nodes`]). A server
//! that does not know a script (`NOSCRIPT`) gets them all loaded and the call runs again
//! ([`Conn::with_scripts`]).

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, FromRedisValue, Pipeline, RedisResult, Value};

use crate::error::is_noscript;
use crate::primaries::Primaries;
use crate::scripts::{self, Call};

/// The store's connection: a standalone server, or a cluster (the cluster client for single
/// commands, and the primaries' map and connections for batches).
#[derive(Clone)]
pub(crate) enum Conn {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection, Arc<Primaries>),
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Conn::Standalone(_) => "Standalone",
            Conn::Cluster(..) => "Cluster",
        })
    }
}

impl Conn {
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(..))
    }

    /// Send `cmd` (through the cluster client in cluster mode, which routes it by its key
    /// and follows redirections).
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Conn::Standalone(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c, _) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// Send `pipe` (whose keyed commands share one slot) and return every reply, server
    /// errors included as [`Value::ServerError`].
    pub(crate) async fn query_pipeline(&self, pipe: &Pipeline) -> RedisResult<Vec<Value>> {
        match self {
            Conn::Standalone(c) => pipe.query_async(&mut c.clone()).await,
            Conn::Cluster(c, _) => pipe.query_async(&mut c.clone()).await,
        }
    }

    /// `SCRIPT LOAD` every script (on every node of a cluster).
    pub(crate) async fn load_scripts(&self) -> RedisResult<()> {
        for lua in scripts::all() {
            let mut cmd = redis::cmd("SCRIPT");
            cmd.arg("LOAD").arg(lua.code);
            let _: Value = self.query(&cmd).await?;
        }
        Ok(())
    }

    /// Run one call; on `NOSCRIPT`, load the scripts and run it again.
    pub(crate) async fn eval(&self, call: &Call) -> RedisResult<Value> {
        self.eval_cmd(&call.cmd()).await
    }

    /// Run one `EVALSHA`; on `NOSCRIPT`, load the scripts and run it again.
    pub(crate) async fn eval_cmd(&self, cmd: &Cmd) -> RedisResult<Value> {
        self.with_scripts(|| self.query(cmd)).await
    }

    /// Run `send` (script calls); on `NOSCRIPT` (a restarted or failed-over server, `SCRIPT
    /// FLUSH`), load the scripts and run it again.
    pub(crate) async fn with_scripts<T, F, Fut>(&self, send: F) -> RedisResult<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        match send().await {
            Err(e) if is_noscript(&e) => {
                self.load_scripts().await?;
                send().await
            }
            other => other,
        }
    }
}
