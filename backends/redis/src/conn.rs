//! The one connection the store logic talks through: a standalone server behind a
//! [`ConnectionManager`] (multiplexed, reconnects by itself) or a Redis Cluster behind a
//! [`ClusterConnection`] (multiplexed per node, follows slot moves and failovers).
//!
//! Everything the store does is an `EVALSHA` of one of [`crate::scripts`] on one key
//! ([`Call`]), sent alone ([`Conn::eval`]) or as pipelines ([`Conn::eval_many`],
//! [`Conn::eval_batch`]); plain commands on single keys, the fresh-key claims, as pipelines
//! too ([`Conn::run_keyed`]); and `SCAN` for purge.
//!
//! In cluster mode a batch goes as one pipeline per primary (all sent concurrently), over
//! the connections of [`Primaries`]: the keys carry no hash tag, so a batch of N keys spans
//! about N slots, and one pipeline per slot made N requests (16 tasks of 1000 keys queued
//! 16 000 of them in the cluster client, past its response timeout).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::try_join_all;
use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, FromRedisValue, Pipeline, RedisError, RedisResult, ToRedisArgs, Value};

use crate::error::is_noscript;
use crate::layout;
use crate::primaries::{self, Address, Primaries};
use crate::scripts::{self, Lua};

/// Items (script calls or commands on one key each) per pipeline to one primary, about: a
/// primary's share of a larger batch is split at slot boundaries into pipelines of this
/// many (a slot's items stay together, in order), all sent at once. The server interleaves
/// other clients between reads of a long pipeline anyway; the bound is for the client: the
/// response timeout covers a whole pipeline, and a pipeline's replies come back together.
/// 1000 items take a node about 10-50 ms (10-50 us of server time per script call).
pub(crate) const PIPELINE_ITEMS: usize = 1000;

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

    fn slot(&self) -> u16 {
        layout::slot(&self.key)
    }
}

/// Where a purge step runs (`SCAN` and all): the one server, or one cluster primary.
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

/// One `SCAN` step: where to go on, and what it found.
pub(crate) struct ScanStep {
    /// The next cursor (0: the node's keyspace is walked).
    pub(crate) next: u64,
    /// The keys found.
    pub(crate) keys: Vec<Vec<u8>>,
}

impl BatchReply {
    /// Put the parts' replies (the calls' indexes, their replies, the part's
    /// acknowledgements) back in call order; the fewest acknowledgements count.
    fn gather(len: usize, replies: Vec<(Vec<usize>, Vec<Value>, Option<i64>)>) -> Self {
        let mut values = vec![Value::Nil; len];
        let mut acknowledged: Option<i64> = None;
        for (items, part_values, acked) in replies {
            for (i, v) in items.into_iter().zip(part_values) {
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

/// Where one pipeline goes.
enum Route {
    /// Through the store's connection: the standalone server, or the cluster client (which
    /// routes a pipeline by its one slot).
    Conn,
    /// Straight to one cluster primary: the pipeline may span that primary's slots.
    Node(MultiplexedConnection),
}

/// One pipeline of a batch: where it goes and its items' indexes, by hash slot (call order
/// within a slot).
struct Part {
    route: Route,
    slots: Vec<Vec<usize>>,
}

impl Part {
    fn items(&self) -> impl Iterator<Item = usize> + '_ {
        self.slots.iter().flatten().copied()
    }

    fn len(&self) -> usize {
        self.slots.iter().map(Vec::len).sum()
    }
}

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

    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Conn::Standalone(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c, _) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// Send `pipe` (whose keyed commands share one slot) and return every reply, server
    /// errors included as [`Value::ServerError`].
    async fn query_pipeline(&self, pipe: &Pipeline) -> RedisResult<Vec<Value>> {
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
    async fn eval_cmd(&self, cmd: &Cmd) -> RedisResult<Value> {
        self.with_scripts(|| self.query(cmd)).await
    }

    /// Run `send` (script calls); on `NOSCRIPT` (a restarted or failed-over server, `SCRIPT
    /// FLUSH`), load the scripts and run it again.
    async fn with_scripts<T, F, Fut>(&self, send: F) -> RedisResult<T>
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

    /// Run `calls` as pipelines: one for a standalone server, one per primary in cluster
    /// mode (see [`Conn::plan`]; all sent concurrently), each followed by `WAIT` when `wait`
    /// is set. Calls on one key keep their order (one key, one slot, one pipeline, one
    /// connection).
    pub(crate) async fn eval_many(
        &self,
        calls: &[Call],
        wait: Option<(u32, Duration)>,
    ) -> RedisResult<BatchReply> {
        let parts = self.plan(calls.iter().map(Call::slot)).await?;
        let replies = try_join_all(parts.iter().map(|part| async move {
            let cmds = part.items().map(|i| calls[i].cmd()).collect();
            let (values, acked) = self.eval_group(&part.route, cmds, wait).await?;
            Ok::<_, RedisError>((part.items().collect(), values, acked))
        }))
        .await?;
        Ok(BatchReply::gather(calls.len(), replies))
    }

    /// Run `calls` (all of one claim or commit script, all with the same first
    /// [`SHARED_ARGS`] arguments) as one call of `many` (`lua/many.lua`: the same
    /// operation on each key in order) per hash slot: the whole batch on a standalone
    /// server; in cluster mode one call per slot, the calls of a primary's slots in one
    /// pipeline to it (see [`Conn::plan`]; all sent concurrently), each pipeline followed by
    /// `WAIT` when `wait` is set. Replies are per call, in call order, as if each call had
    /// run alone, one after another.
    pub(crate) async fn eval_batch(
        &self,
        many: &'static Lua,
        calls: &[Call],
        wait: Option<(u32, Duration)>,
    ) -> RedisResult<BatchReply> {
        let parts = self.plan(calls.iter().map(Call::slot)).await?;
        let replies = try_join_all(parts.iter().map(|part| async move {
            let cmds = part
                .slots
                .iter()
                .map(|slot| batch_cmd(many, calls, slot))
                .collect();
            let (values, acked) = self.eval_group(&part.route, cmds, wait).await?;
            let mut items = Vec::with_capacity(part.len());
            for (slot, value) in part.slots.iter().zip(values) {
                match value {
                    Value::Array(replies) if replies.len() == slot.len() => items.extend(replies),
                    other => {
                        return Err(RedisError::from((
                            redis::ErrorKind::UnexpectedReturnType,
                            "batch script reply",
                            format!("expected {} replies, got {other:?}", slot.len()),
                        )));
                    }
                }
            }
            Ok((part.items().collect(), items, acked))
        }))
        .await?;
        Ok(BatchReply::gather(calls.len(), replies))
    }

    /// How to send calls on these slots: all in one pipeline on a standalone server, or
    /// through the cluster client when they share one slot (a single operation). Otherwise
    /// by primary, from the cached slot map ([`Primaries`]): one pipeline per primary, split
    /// in pipelines of about [`PIPELINE_ITEMS`] items; a slot the map has no primary for
    /// goes through the cluster client alone. Within a part, calls are grouped by slot, in
    /// call order within a slot.
    async fn plan(&self, slots: impl ExactSizeIterator<Item = u16>) -> RedisResult<Vec<Part>> {
        let len = slots.len();
        let whole = || match len {
            0 => Vec::new(),
            _ => vec![Part {
                route: Route::Conn,
                slots: vec![(0..len).collect()],
            }],
        };
        let Conn::Cluster(cluster, primaries) = self else {
            return Ok(whole());
        };
        let mut by_slot: HashMap<u16, Vec<usize>> = HashMap::new();
        let mut order = Vec::new();
        for (i, slot) in slots.enumerate() {
            by_slot
                .entry(slot)
                .or_insert_with(|| {
                    order.push(slot);
                    Vec::new()
                })
                .push(i);
        }
        if order.len() < 2 {
            return Ok(whole());
        }
        let map = primaries.map(cluster).await?;
        let mut by_node: HashMap<usize, Vec<Vec<usize>>> = HashMap::new();
        let mut parts = Vec::new();
        for slot in order {
            let items = by_slot.remove(&slot).unwrap_or_default();
            match map.owner(slot) {
                Some(node) => by_node.entry(node).or_default().push(items),
                None => parts.push(Part {
                    route: Route::Conn,
                    slots: vec![items],
                }),
            }
        }
        for (node, slots) in by_node {
            for slots in pipelines(slots, PIPELINE_ITEMS) {
                parts.push(Part {
                    route: Route::Node(map.connection(node)),
                    slots,
                });
            }
        }
        Ok(parts)
    }

    /// Run plain commands, each on the one key given with it, as pipelines: one for a
    /// standalone server, one per primary in cluster mode (see [`Conn::plan`]; all sent
    /// concurrently). One result per command, in order, a server error as its `Err`; a
    /// command the cluster redirected (`MOVED` / `ASK` / `TRYAGAIN`) runs again alone
    /// through the path that follows redirections. Commands on one key keep their order. A
    /// failed connection fails the whole call.
    pub(crate) async fn run_keyed(
        &self,
        cmds: &[(&[u8], Cmd)],
    ) -> RedisResult<Vec<RedisResult<Value>>> {
        let parts = self
            .plan(cmds.iter().map(|(key, _)| layout::slot(key)))
            .await?;
        let replies = try_join_all(parts.iter().map(|part| async move {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for i in part.items() {
                pipe.add_command(cmds[i].1.clone());
            }
            let values = self.send(&part.route, &pipe).await?;
            let mut results = Vec::with_capacity(values.len());
            for (v, i) in values.into_iter().zip(part.items()) {
                results.push(match v {
                    Value::ServerError(se) => {
                        let e = RedisError::from(se);
                        if e.is_cluster_error() {
                            self.redirected();
                            self.query(&cmds[i].1).await
                        } else {
                            Err(e)
                        }
                    }
                    v => Ok(v),
                });
            }
            Ok::<_, RedisError>((part.items().collect::<Vec<_>>(), results))
        }))
        .await?;
        let mut out: Vec<Option<RedisResult<Value>>> = (0..cmds.len()).map(|_| None).collect();
        for (items, results) in replies {
            for (i, r) in items.into_iter().zip(results) {
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

    /// Send `pipe` along `route`; every reply, server errors included as
    /// [`Value::ServerError`]. A failed connection to a primary drops the slot map and its
    /// connections (the next batch connects again).
    async fn send(&self, route: &Route, pipe: &Pipeline) -> RedisResult<Vec<Value>> {
        match route {
            Route::Conn => self.query_pipeline(pipe).await,
            Route::Node(node) => {
                let sent = pipe.query_async(&mut node.clone()).await;
                if let (Err(_), Conn::Cluster(_, primaries)) = (&sent, self) {
                    primaries.broken();
                }
                sent
            }
        }
    }

    /// A node redirected a command: the slot map is stale.
    fn redirected(&self) {
        if let Conn::Cluster(_, primaries) = self {
            primaries.redirected();
        }
    }

    /// Make the cached slot map wrong on purpose (see [`Primaries::misroute`]); nothing on
    /// a standalone server.
    pub(crate) async fn misroute(&self) -> RedisResult<()> {
        match self {
            Conn::Cluster(cluster, primaries) => primaries.misroute(cluster).await,
            Conn::Standalone(_) => Ok(()),
        }
    }

    /// Send `cmds` along `route` as one pipeline, followed by `WAIT` when `wait` is set;
    /// one reply per command.
    async fn eval_group(
        &self,
        route: &Route,
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
        let mut values = self.send(route, &pipe).await?;
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
                if e.is_cluster_error() {
                    self.redirected();
                } else if !is_noscript(&e) {
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
        let Conn::Cluster(cluster, _) = self else {
            return Ok(vec![ScanNode::Standalone]);
        };
        let ranges = primaries::read_slot_ranges(cluster).await?;
        Ok(primaries::addresses(&ranges)
            .into_iter()
            .map(|Address { host, port }| ScanNode::Primary { host, port })
            .collect())
    }

    /// One `SCAN cursor MATCH pattern COUNT count` step on `node`.
    pub(crate) async fn scan(
        &self,
        node: &ScanNode,
        cursor: u64,
        pattern: &str,
        count: usize,
    ) -> RedisResult<ScanStep> {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        let (next, keys) = FromRedisValue::from_redis_value(self.query_on(node, &cmd).await?)?;
        Ok(ScanStep { next, keys })
    }

    /// A keyless script call on `node`, with the scripts loaded first when the node does
    /// not know them.
    pub(crate) async fn eval_on(&self, node: &ScanNode, cmd: &Cmd) -> RedisResult<Value> {
        self.with_scripts(|| self.query_on(node, cmd)).await
    }

    /// A keyless command on `node`: the server, or one cluster primary by address.
    async fn query_on(&self, node: &ScanNode, cmd: &Cmd) -> RedisResult<Value> {
        match (self, node) {
            (Conn::Cluster(c, _), ScanNode::Primary { host, port }) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                c.clone()
                    .route_command(cmd.clone(), routing)
                    .await?
                    .extract_error()
            }
            _ => self.query(cmd).await,
        }
    }
}

/// `slots` (each the items of one slot) in runs of at most `max` items, in order; a slot is
/// never split (one larger than `max` is a run of its own).
fn pipelines(slots: Vec<Vec<usize>>, max: usize) -> Vec<Vec<Vec<usize>>> {
    let mut runs: Vec<Vec<Vec<usize>>> = Vec::new();
    let mut len = 0;
    for slot in slots {
        match runs.last_mut() {
            Some(run) if len + slot.len() <= max => {
                len += slot.len();
                run.push(slot);
            }
            _ => {
                len = slot.len();
                runs.push(vec![slot]);
            }
        }
    }
    runs
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_pipelines_hold_whole_slots_up_to_the_bound() {
        let slots = vec![
            vec![0, 1],
            vec![2],
            vec![3, 4, 5],
            vec![6],
            vec![7, 8, 9, 10, 11],
        ];
        assert_eq!(
            pipelines(slots.clone(), 4),
            [
                vec![vec![0, 1], vec![2]],
                vec![vec![3, 4, 5], vec![6]],
                vec![vec![7, 8, 9, 10, 11]],
            ]
        );
        assert_eq!(pipelines(slots.clone(), 100), [slots]);
        assert!(pipelines(Vec::new(), 4).is_empty());
    }
}
