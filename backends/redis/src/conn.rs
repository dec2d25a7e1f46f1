//! The one connection the store logic talks through: a standalone server behind a
//! [`ConnectionManager`] (multiplexed, reconnects by itself) or a Redis Cluster behind a
//! [`ClusterConnection`] (multiplexed per node, follows slot moves and failovers).
//!
//! Everything the store does is an `EVALSHA` of one of [`crate::scripts`] on one key
//! ([`Call`]), sent alone ([`Conn::eval`]) or as pipelines ([`Conn::eval_many`]: one
//! pipeline per hash slot in cluster mode, all sent concurrently); plain commands on single
//! keys, the fresh-key claims, as pipelines too ([`Conn::run_keyed`]); and `SCAN` for purge.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use futures::future::try_join_all;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo, Slot};
use redis::{Cmd, FromRedisValue, Pipeline, RedisError, RedisResult, ToRedisArgs, Value};

use crate::error::is_noscript;
use crate::layout;
use crate::scripts::{self, Lua};

/// One script invocation on one key.
pub(crate) struct Call {
    lua: &'static Lua,
    key: Vec<u8>,
    args: Vec<Vec<u8>>,
}

impl Call {
    /// `lua` on `key`, no arguments yet.
    pub(crate) fn new(lua: &'static Lua, key: impl Into<Vec<u8>>) -> Self {
        Call {
            lua,
            key: key.into(),
            args: Vec::with_capacity(6),
        }
    }

    /// Append `ARGV[n]`.
    pub(crate) fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    fn cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.lua.sha).arg(1).arg(&self.key);
        for a in &self.args {
            cmd.arg(a);
        }
        cmd
    }

    fn slot(&self) -> Slot {
        layout::slot(&self.key)
    }
}

/// Where `SCAN` runs: the one server, or one cluster primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ScanNode {
    Standalone,
    Primary { host: String, port: u16 },
}

/// What a batch of calls returned.
pub(crate) struct BatchReply {
    /// One reply per call, in call order.
    pub(crate) values: Vec<Value>,
    /// With a replica wait: the fewest replicas that acknowledged, over the nodes involved.
    pub(crate) acknowledged: Option<i64>,
}

impl BatchReply {
    /// Put the groups' replies back in call order; the fewest acknowledgements count.
    fn gather(len: usize, groups: &[Vec<usize>], replies: Vec<(Vec<Value>, Option<i64>)>) -> Self {
        let mut values = vec![Value::Nil; len];
        let mut acknowledged: Option<i64> = None;
        for (group, (group_values, acked)) in groups.iter().zip(replies) {
            for (&i, v) in group.iter().zip(group_values) {
                values[i] = v;
            }
            if let Some(a) = acked {
                acknowledged = Some(acknowledged.map_or(a, |m| m.min(a)));
            }
        }
        BatchReply {
            values,
            acknowledged,
        }
    }
}

#[derive(Clone)]
pub(crate) enum Conn {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Conn::Standalone(_) => "Standalone",
            Conn::Cluster(_) => "Cluster",
        })
    }
}

impl Conn {
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }

    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Conn::Standalone(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// Send `pipe` (whose keyed commands share one slot) and return every reply, server
    /// errors included as [`Value::ServerError`].
    async fn query_pipeline(&self, pipe: &Pipeline) -> RedisResult<Vec<Value>> {
        match self {
            Conn::Standalone(c) => pipe.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => pipe.query_async(&mut c.clone()).await,
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
    async fn eval_cmd(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self.query(cmd).await {
            Err(e) if is_noscript(&e) => {
                self.load_scripts().await?;
                self.query(cmd).await
            }
            other => other,
        }
    }

    /// Run `calls` as pipelines: one for a standalone server, one per hash slot in cluster
    /// mode (all sent concurrently), each followed by `WAIT` when `wait` is set. Calls on
    /// one key keep their order (one key, one slot, one pipeline, one connection).
    pub(crate) async fn eval_many(
        &self,
        calls: &[Call],
        wait: Option<(u32, Duration)>,
    ) -> RedisResult<BatchReply> {
        let groups = self.groups(calls.iter().map(Call::slot));
        let replies = try_join_all(groups.iter().map(|group| {
            let cmds = group.iter().map(|&i| calls[i].cmd()).collect();
            self.eval_group(cmds, wait)
        }))
        .await?;
        Ok(BatchReply::gather(calls.len(), &groups, replies))
    }

    /// Run `calls` (all of one claim or commit script, all with the same first
    /// [`SHARED_ARGS`] arguments) as one call of `many` (`lua/many.lua`: the same
    /// operation on each key in order) per group: the whole batch on a standalone server,
    /// one per hash slot in cluster mode (all sent concurrently), each followed by `WAIT`
    /// when `wait` is set. Replies are per call, in call order, as if each call had run
    /// alone, one after another.
    pub(crate) async fn eval_batch(
        &self,
        many: &'static Lua,
        calls: &[Call],
        wait: Option<(u32, Duration)>,
    ) -> RedisResult<BatchReply> {
        let groups = self.groups(calls.iter().map(Call::slot));
        let replies = try_join_all(groups.iter().map(|group| async move {
            let cmd = batch_cmd(many, calls, group);
            let (mut values, acked) = self.eval_group(vec![cmd], wait).await?;
            let items = match values.pop() {
                Some(Value::Array(items)) if items.len() == group.len() => items,
                other => {
                    return Err(RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "batch script reply",
                        format!("expected {} replies, got {other:?}", group.len()),
                    )));
                }
            };
            Ok((items, acked))
        }))
        .await?;
        Ok(BatchReply::gather(calls.len(), &groups, replies))
    }

    /// The indexes of calls on these slots, grouped: all together on a standalone server,
    /// by hash slot in cluster mode (in call order within a group).
    fn groups(&self, slots: impl ExactSizeIterator<Item = Slot>) -> Vec<Vec<usize>> {
        if self.is_cluster() {
            let mut by_slot: HashMap<Slot, Vec<usize>> = HashMap::new();
            for (i, slot) in slots.enumerate() {
                by_slot.entry(slot).or_default().push(i);
            }
            by_slot.into_values().collect()
        } else if slots.len() == 0 {
            Vec::new()
        } else {
            vec![(0..slots.len()).collect()]
        }
    }

    /// Run plain commands, each on the one key given with it, as pipelines: one for a
    /// standalone server, one per hash slot in cluster mode (all sent concurrently). One
    /// result per command, in order, a server error as its `Err`; a command the cluster
    /// redirected (`MOVED` / `ASK` / `TRYAGAIN`) runs again alone through the path that
    /// follows redirections. Commands on one key keep their order. A failed connection
    /// fails the whole call.
    pub(crate) async fn run_keyed(
        &self,
        cmds: &[(&[u8], Cmd)],
    ) -> RedisResult<Vec<RedisResult<Value>>> {
        let groups = self.groups(cmds.iter().map(|(key, _)| layout::slot(key)));
        let replies = try_join_all(groups.iter().map(|group| async move {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for &i in group {
                pipe.add_command(cmds[i].1.clone());
            }
            let values = self.query_pipeline(&pipe).await?;
            let mut results = Vec::with_capacity(values.len());
            for (v, &i) in values.into_iter().zip(group) {
                results.push(match v {
                    Value::ServerError(se) => {
                        let e = RedisError::from(se);
                        if e.is_cluster_error() {
                            self.query(&cmds[i].1).await
                        } else {
                            Err(e)
                        }
                    }
                    v => Ok(v),
                });
            }
            Ok::<_, RedisError>(results)
        }))
        .await?;
        let mut out: Vec<Option<RedisResult<Value>>> = (0..cmds.len()).map(|_| None).collect();
        for (group, results) in groups.iter().zip(replies) {
            for (&i, r) in group.iter().zip(results) {
                out[i] = Some(r);
            }
        }
        Ok(out
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "pipeline reply",
                        "fewer replies than commands".to_owned(),
                    )))
                })
            })
            .collect())
    }

    /// Send `cmds` (all on one slot) as one pipeline, followed by `WAIT` when `wait` is set;
    /// one reply per command.
    async fn eval_group(
        &self,
        cmds: Vec<Cmd>,
        wait: Option<(u32, Duration)>,
    ) -> RedisResult<(Vec<Value>, Option<i64>)> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for cmd in &cmds {
            pipe.add_command(cmd.clone());
        }
        if let Some(w) = wait {
            pipe.add_command(wait_cmd(w));
        }
        let mut values = self.query_pipeline(&pipe).await?;
        let mut acked = match wait {
            Some(_) => Some(wait_reply(values.pop())?),
            None => None,
        };
        // Commands the server did not run: the script was unknown (NOSCRIPT) or the slot
        // moved (MOVED / ASK / TRYAGAIN). They run again one by one, in order, through the
        // paths that load scripts and follow redirections.
        let mut rerun = false;
        for (v, cmd) in values.iter_mut().zip(&cmds) {
            if let Value::ServerError(se) = v {
                let e = RedisError::from(se.clone());
                if !(is_noscript(&e) || e.is_cluster_error()) {
                    return Err(e);
                }
                *v = self.eval_cmd(cmd).await?;
                rerun = true;
            }
        }
        if let (true, Some(w)) = (rerun, wait) {
            // The pipeline's WAIT ran before the re-run writes: wait for those too.
            let again = wait_reply(Some(self.query(&wait_cmd(w)).await?))?;
            acked = Some(acked.map_or(again, |a| a.min(again)));
        }
        Ok((values, acked))
    }

    /// The nodes a full `SCAN` must visit: the server, or every cluster primary.
    pub(crate) async fn scan_nodes(&self) -> RedisResult<Vec<ScanNode>> {
        if !self.is_cluster() {
            return Ok(vec![ScanNode::Standalone]);
        }
        let slots: Value = self
            .query(&redis::cmd("CLUSTER").arg("SLOTS").clone())
            .await?;
        let mut nodes = Vec::new();
        for range in array(slots)? {
            // [start, end, [host, port, id, ...], replicas...]
            let primary = array(array(range)?.into_iter().nth(2).unwrap_or(Value::Nil))?;
            let mut it = primary.into_iter();
            let host: String = FromRedisValue::from_redis_value(it.next().unwrap_or(Value::Nil))?;
            let port: u16 = FromRedisValue::from_redis_value(it.next().unwrap_or(Value::Nil))?;
            let node = ScanNode::Primary { host, port };
            if !nodes.contains(&node) {
                nodes.push(node);
            }
        }
        Ok(nodes)
    }

    /// One `SCAN cursor MATCH pattern COUNT count` step on `node`.
    pub(crate) async fn scan(
        &self,
        node: &ScanNode,
        cursor: u64,
        pattern: &str,
        count: usize,
    ) -> RedisResult<(u64, Vec<Vec<u8>>)> {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        match (self, node) {
            (Conn::Cluster(c), ScanNode::Primary { host, port }) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                let value = c.clone().route_command(cmd, routing).await?;
                Ok(FromRedisValue::from_redis_value(value.extract_error()?)?)
            }
            _ => self.query(&cmd).await,
        }
    }
}

/// How many leading arguments of a claim or commit [`Call`] every item of a batch shares
/// (`now`, retention: see `lua/one.lua` and `lua/many.lua`); they are sent once.
pub(crate) const SHARED_ARGS: usize = 2;

/// `EVALSHA many` over the calls at `group`: their keys, the shared arguments once, then
/// each call's own arguments in order.
fn batch_cmd(many: &Lua, calls: &[Call], group: &[usize]) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(&many.sha).arg(group.len());
    for &i in group {
        cmd.arg(&calls[i].key);
    }
    if let Some(&first) = group.first() {
        let shared = &calls[first].args[..SHARED_ARGS];
        debug_assert!(
            group
                .iter()
                .all(|&i| calls[i].args[..SHARED_ARGS] == *shared)
        );
        for a in shared {
            cmd.arg(a);
        }
    }
    for &i in group {
        for a in &calls[i].args[SHARED_ARGS..] {
            cmd.arg(a);
        }
    }
    cmd
}

fn wait_cmd((replicas, timeout): (u32, Duration)) -> Cmd {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(replicas)
        .arg(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
    cmd
}

fn wait_reply(v: Option<Value>) -> RedisResult<i64> {
    Ok(FromRedisValue::from_redis_value(
        v.unwrap_or(Value::Nil).extract_error()?,
    )?)
}

fn array(v: Value) -> RedisResult<Vec<Value>> {
    Ok(FromRedisValue::from_redis_value(v)?)
}
