//! Calls on each node rather than on a key, for admin and purge: the nodes a full `SCAN`
//! must visit (the server, or every cluster primary), one `SCAN` step on one of them, and a
//! keyless script (a purge step, `lua/purge_step.lua`) on one of them by address.

use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, FromRedisValue, RedisResult, Value};

use crate::conn::Conn;
use crate::primaries::{self, Address};

/// Where a purge step runs (`SCAN` and all): the one server, or one cluster primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ScanNode {
    Standalone,
    Primary { host: String, port: u16 },
}

/// One `SCAN` step: where to go on, and what it found.
pub(crate) struct ScanStep {
    /// The next cursor (0: the node's keyspace is walked).
    pub(crate) next: u64,
    /// The keys found.
    pub(crate) keys: Vec<Vec<u8>>,
}

impl Conn {
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
