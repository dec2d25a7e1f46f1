//! Batches: calls (script calls, or plain commands on one key each) sent as pipelines, one
//! for a standalone server, and in cluster mode one per primary (all sent concurrently),
//! each followed by `WAIT` for replicas when asked.
//!
//! In cluster mode a batch goes as one pipeline per primary over the connections of
//! [`Primaries`](crate::primaries::Primaries) (see [`Conn::plan`]): the keys carry no hash
//! tag, so a batch of N keys spans about N slots, and one pipeline per slot made N requests
//! (16 tasks of 1000 keys queued 16 000 of them in the cluster client, past its response
//! timeout).
//!
//! Invariant: a command a primary redirected (`MOVED` / `ASK` / `TRYAGAIN`) did not run, and
//! runs again alone through the cluster client (which follows the redirection), in order
//! with the other commands on its key; a stale map is re-read after a redirection (the
//! next batch reads `CLUSTER SLOTS` again). A command the server did not know the script of
//! (`NOSCRIPT`) runs again alone too, after the scripts are loaded. When a pipeline's
//! commands ran again, its `WAIT` ran before their writes: one more `WAIT` follows them.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::try_join_all;
use redis::aio::MultiplexedConnection;
use redis::{Cmd, FromRedisValue, Pipeline, RedisError, RedisResult, Value};

use crate::conn::Conn;
use crate::error::is_noscript;
use crate::schema;
use crate::scripts::{Call, Lua, many_cmd};

/// Items (script calls or commands on one key each) per pipeline to one primary, about: a
/// primary's share of a larger batch is split at slot boundaries into pipelines of this
/// many (a slot's items stay together, in order), all sent at once. The server interleaves
/// other clients between reads of a long pipeline anyway; the bound is for the client: the
/// response timeout covers a whole pipeline, and a pipeline's replies come back together.
/// 1000 items take a node about 10-50 ms (10-50 us of server time per script call).
pub(crate) const PIPELINE_ITEMS: usize = 1000;

/// What a batch of calls returned.
pub(crate) struct BatchReply {
    /// One reply per call, in call order.
    pub(crate) values: Vec<Value>,
    /// With a replica wait: the fewest replicas that acknowledged, over the nodes involved.
    pub(crate) acknowledged: Option<i64>,
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

impl Conn {
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
    /// [`SHARED_ARGS`](crate::scripts::SHARED_ARGS) arguments) as one call of `many`
    /// (`lua/many.lua`: the same operation on each key in order, see [`many_cmd`]) per hash
    /// slot: the whole batch on a standalone
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
                .map(|slot| many_cmd(many, calls, slot))
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
    /// by primary, from the cached slot map ([`Primaries`](crate::primaries::Primaries)):
    /// one pipeline per primary, split in pipelines of about [`PIPELINE_ITEMS`] items; a
    /// slot the map has no primary for goes through the cluster client alone. Within a part,
    /// calls are grouped by slot, in call order within a slot.
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

    /// Run plain commands all on `key`, in order, as one pipeline (in cluster mode as
    /// [`Conn::run_keyed`] sends them). One result per command, a server error as its `Err`.
    pub(crate) async fn run_on_key<'a>(
        &self,
        key: &[u8],
        cmds: impl IntoIterator<Item = &'a Cmd>,
    ) -> RedisResult<Vec<RedisResult<Value>>> {
        if self.is_cluster() {
            let cmds: Vec<(&[u8], Cmd)> = cmds.into_iter().map(|c| (key, c.clone())).collect();
            return self.run_keyed(&cmds).await;
        }
        let values = self.query_pipeline(&pipeline_of(cmds)).await?;
        Ok(values
            .into_iter()
            .map(|v| match v {
                Value::ServerError(se) => Err(RedisError::from(se)),
                v => Ok(v),
            })
            .collect())
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
            .plan(cmds.iter().map(|(key, _)| schema::slot(key)))
            .await?;
        let replies = try_join_all(parts.iter().map(|part| async move {
            let pipe = pipeline_of(part.items().map(|i| &cmds[i].1));
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

    /// Make the cached slot map wrong on purpose (see
    /// [`Primaries::misroute`](crate::primaries::Primaries::misroute)); nothing on a
    /// standalone server. A test hook (feature `test-hooks`).
    #[cfg(feature = "test-hooks")]
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
        let mut pipe = pipeline_of(&cmds);
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
}

/// `cmds` as one pipeline whose replies all come back, server errors included as
/// [`Value::ServerError`] (a redirected or unknown-script command is run again).
fn pipeline_of<'a>(cmds: impl IntoIterator<Item = &'a Cmd>) -> Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for cmd in cmds {
        pipe.add_command(cmd.clone());
    }
    pipe
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

/// `WAIT replicas timeout`.
fn wait_cmd((replicas, timeout): (u32, Duration)) -> Cmd {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(replicas)
        .arg(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
    cmd
}

/// The replicas that acknowledged, from `WAIT`'s reply.
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
