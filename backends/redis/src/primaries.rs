//! A cluster's primaries as batches see them: which primary owns each hash slot (read from
//! `CLUSTER SLOTS`) and one connection to each, so that a batch reaches a node as one
//! pipeline whatever slots its keys hash to.
//!
//! Why not the cluster client's own connections: it refuses a pipeline whose commands span
//! slots, and where one can be forced on it (`route_pipeline`), a `MOVED` or `ASK` reply to
//! any one command makes it send the whole pipeline again to the node named there, so that
//! the commands that had already run would run twice. A pipeline sent here comes back as the
//! node answered it; a command the node redirected did not run, and [`crate::pipeline`] runs it
//! again alone through the cluster client, which follows the redirection.
//!
//! The map is cached: read on first use, read again after a redirection (the map was stale),
//! and dropped with its connections after a connection error (the next batch connects
//! again). A slot no primary serves is left out: its commands go through the cluster client.

use std::sync::{Arc, Mutex, PoisonError};

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, FromRedisValue, RedisResult, Value,
};

use crate::schema::SLOTS;

/// A primary's address, as `CLUSTER SLOTS` gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Address {
    pub(crate) host: String,
    pub(crate) port: u16,
}

/// The slots `start..=end` and the primary serving them.
pub(crate) struct SlotRange {
    start: u16,
    end: u16,
    primary: Address,
}

/// `CLUSTER SLOTS`: `[start, end, [host, port, id, ...], replicas...]` per range.
pub(crate) fn slot_ranges(reply: Value) -> RedisResult<Vec<SlotRange>> {
    let mut ranges = Vec::new();
    for range in array(reply)? {
        let mut fields = array(range)?.into_iter();
        let mut field = || fields.next().unwrap_or(Value::Nil);
        let start: u16 = FromRedisValue::from_redis_value(field())?;
        let end: u16 = FromRedisValue::from_redis_value(field())?;
        let mut node = array(field())?.into_iter();
        let host: String = FromRedisValue::from_redis_value(node.next().unwrap_or(Value::Nil))?;
        let port: u16 = FromRedisValue::from_redis_value(node.next().unwrap_or(Value::Nil))?;
        ranges.push(SlotRange {
            start,
            end,
            primary: Address { host, port },
        });
    }
    Ok(ranges)
}

/// `CLUSTER SLOTS`, asked through the cluster client.
pub(crate) async fn read_slot_ranges(cluster: &ClusterConnection) -> RedisResult<Vec<SlotRange>> {
    let reply: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut cluster.clone())
        .await?;
    slot_ranges(reply)
}

/// The distinct primaries of `ranges`, in order of first appearance.
pub(crate) fn addresses(ranges: &[SlotRange]) -> Vec<Address> {
    let mut out: Vec<Address> = Vec::new();
    for r in ranges {
        if !out.contains(&r.primary) {
            out.push(r.primary.clone());
        }
    }
    out
}

fn array(v: Value) -> RedisResult<Vec<Value>> {
    Ok(FromRedisValue::from_redis_value(v)?)
}

/// Which primary owns each slot, and a connection to each primary.
#[derive(Clone)]
pub(crate) struct SlotMap {
    /// Per slot, an index into `nodes`, or [`SlotMap::NO_OWNER`].
    owners: Vec<u16>,
    nodes: Vec<(Address, MultiplexedConnection)>,
}

impl SlotMap {
    const NO_OWNER: u16 = u16::MAX;

    /// The primary serving `slot` (an index for [`SlotMap::connection`]), if the map knows
    /// one.
    pub(crate) fn owner(&self, slot: u16) -> Option<usize> {
        match self.owners.get(usize::from(slot)) {
            Some(&n) if n != Self::NO_OWNER => Some(usize::from(n)),
            _ => None,
        }
    }

    /// The connection to primary `node`.
    pub(crate) fn connection(&self, node: usize) -> MultiplexedConnection {
        self.nodes[node].1.clone()
    }
}

/// How to connect to a primary: like the first seed node (credentials, protocol, TLS), at
/// the primary's host and port, with these timeouts.
#[derive(Clone)]
pub(crate) struct NodeSettings {
    pub(crate) template: ConnectionInfo,
    pub(crate) config: AsyncConnectionConfig,
}

/// The cached [`SlotMap`] of one store connection, and how to connect to a primary.
pub(crate) struct Primaries {
    settings: NodeSettings,
    current: Mutex<Current>,
    /// Held while reading the map, so that concurrent batches read it once.
    reading: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Current {
    map: Option<Arc<SlotMap>>,
    /// A node redirected a command: read the map again before the next batch.
    stale: bool,
}

impl Primaries {
    /// Primaries reached as `settings` say; no map yet.
    pub(crate) fn new(settings: NodeSettings) -> Self {
        Primaries {
            settings,
            current: Mutex::new(Current::default()),
            reading: tokio::sync::Mutex::new(()),
        }
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn usable(&self) -> Option<Arc<SlotMap>> {
        let current = self.current();
        current.map.clone().filter(|_| !current.stale)
    }

    /// The map: the cached one, or read now through `cluster` (keeping the connections to
    /// primaries that are still primaries).
    pub(crate) async fn map(&self, cluster: &ClusterConnection) -> RedisResult<Arc<SlotMap>> {
        if let Some(map) = self.usable() {
            return Ok(map);
        }
        let _one = self.reading.lock().await;
        if let Some(map) = self.usable() {
            return Ok(map);
        }
        let previous = self.current().map.clone();
        let ranges = read_slot_ranges(cluster).await?;
        let mut map = SlotMap {
            owners: vec![SlotMap::NO_OWNER; usize::from(SLOTS)],
            nodes: Vec::new(),
        };
        for address in addresses(&ranges) {
            let known = previous
                .as_ref()
                .and_then(|p| p.nodes.iter().find(|(a, _)| *a == address));
            let conn = match known {
                Some((_, conn)) => conn.clone(),
                None => self.connect(&address).await?,
            };
            map.nodes.push((address, conn));
        }
        for r in &ranges {
            let node = map.nodes.iter().position(|(a, _)| *a == r.primary);
            let node = node.and_then(|n| u16::try_from(n).ok());
            for slot in r.start..=r.end.min(SLOTS - 1) {
                map.owners[usize::from(slot)] = node.unwrap_or(SlotMap::NO_OWNER);
            }
        }
        let map = Arc::new(map);
        *self.current() = Current {
            map: Some(Arc::clone(&map)),
            stale: false,
        };
        Ok(map)
    }

    /// A node answered `MOVED` / `ASK` / `TRYAGAIN` / `CLUSTERDOWN`: read the map again
    /// before the next batch.
    pub(crate) fn redirected(&self) {
        self.current().stale = true;
    }

    /// A connection to a primary failed: forget the map and its connections.
    pub(crate) fn broken(&self) {
        self.current().map = None;
    }

    /// Make the cached map wrong on purpose: every slot is given to the next primary (a test
    /// hook for the path that handles a stale map, feature `test-hooks`; see
    /// `RedisStore::misroute_slots`).
    #[cfg(feature = "test-hooks")]
    pub(crate) async fn misroute(&self, cluster: &ClusterConnection) -> RedisResult<()> {
        let mut map = SlotMap::clone(&*self.map(cluster).await?);
        let nodes = u16::try_from(map.nodes.len()).unwrap_or(1);
        for owner in map.owners.iter_mut().filter(|o| **o != SlotMap::NO_OWNER) {
            *owner = (*owner + 1) % nodes;
        }
        self.current().map = Some(Arc::new(map));
        Ok(())
    }

    async fn connect(&self, address: &Address) -> RedisResult<MultiplexedConnection> {
        let (host, port) = (address.host.clone(), address.port);
        let NodeSettings { template, config } = &self.settings;
        let addr = match template.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host, port),
        };
        redis::Client::open(template.clone().set_addr(addr))?
            .get_multiplexed_async_connection_with_config(config)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn cluster_slots_reply_is_read_per_range() {
        let node =
            |host: &str, port: i64| Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]);
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7001),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(10922),
                node("10.0.0.2", 7002),
                node("10.0.0.9", 7009),
            ]),
            Value::Array(vec![
                Value::Int(10923),
                Value::Int(16383),
                node("10.0.0.1", 7001),
            ]),
        ]);
        let ranges = slot_ranges(reply).unwrap();
        assert_eq!(
            ranges.iter().map(|r| (r.start, r.end)).collect::<Vec<_>>(),
            [(0, 5460), (5461, 10922), (10923, 16383)]
        );
        let primaries = addresses(&ranges);
        assert_eq!(
            primaries,
            [
                Address {
                    host: "10.0.0.1".into(),
                    port: 7001
                },
                Address {
                    host: "10.0.0.2".into(),
                    port: 7002
                }
            ]
        );
        assert!(slot_ranges(Value::Array(vec![Value::Int(1)])).is_err());
    }
}
