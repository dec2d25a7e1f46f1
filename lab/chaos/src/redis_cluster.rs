//! A private Redis Cluster for the cluster partition scenario: three primaries, each with
//! one replica, `cluster-node-timeout` as given. Primary 0 runs inside a network namespace
//! ([`NetNs`]) bound to its veth address; the five other nodes run on the host bound to the
//! host end of the pair, so cutting the pair leaves primary 0 alone in a minority and its
//! replica with the majority.

use std::path::Path;
use std::time::{Duration, Instant};

use super::netns::NetNs;
use super::redis_server::RedisServer;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The slots of primary `i` of three (as `redis-cli --cluster create` splits them).
pub const SLOTS: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// The cluster; every node is killed when dropped.
pub struct Cluster {
    /// Nodes 0, 1, 2: the primaries (0 in the namespace); 3, 4, 5: their replicas.
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    /// Start the six nodes in `dir`, join them, give the primaries their slots and the
    /// replicas their primaries; returns when every node sees `cluster_state:ok` and every
    /// replica is in sync. Blocking.
    pub fn start(dir: &Path, ns: &NetNs, node_timeout_ms: u64) -> Result<Self, BoxError> {
        let mut nodes = Vec::new();
        for i in 0..6 {
            let node_dir = dir.join(format!("node-{i}"));
            let args: Vec<String> = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                &node_timeout_ms.to_string(),
                "--protected-mode",
                "no",
                // A replica's full sync starts at once (the default waits 5 s for more).
                "--repl-diskless-sync-delay",
                "0",
            ]
            .map(String::from)
            .into();
            nodes.push(if i == 0 {
                RedisServer::start_on(&node_dir, ns.ns_addr, &ns.exec_prefix(), &args)?
            } else {
                RedisServer::start_on(&node_dir, ns.host_addr, &[], &args)?
            });
        }
        let cluster = Cluster { nodes };
        cluster.join()?;
        Ok(cluster)
    }

    fn join(&self) -> Result<(), BoxError> {
        let nodes = &self.nodes;
        for (i, (first, last)) in SLOTS.iter().enumerate() {
            nodes[i].command(&["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()])?;
            nodes[i].command(&[
                "CLUSTER",
                "ADDSLOTSRANGE",
                &first.to_string(),
                &last.to_string(),
            ])?;
        }
        for node in &nodes[1..] {
            let addr = node.addr();
            nodes[0].command(&[
                "CLUSTER",
                "MEET",
                &addr.ip().to_string(),
                &addr.port().to_string(),
            ])?;
        }
        wait_until("every node knows the five others", || {
            for node in nodes {
                let known = node.command(&["CLUSTER", "NODES"])?;
                let joined = known
                    .lines()
                    .filter(|l| !l.contains("handshake") && !l.contains("noaddr"))
                    .count();
                if joined < 6 {
                    return Ok(false);
                }
            }
            Ok(true)
        })?;
        for i in 0..3 {
            let id = nodes[i].command(&["CLUSTER", "MYID"])?;
            nodes[i + 3].command(&["CLUSTER", "REPLICATE", &id])?;
        }
        wait_until("every replica is in sync and the cluster ok", || {
            for replica in &nodes[3..] {
                if replica.info_field("replication", "master_link_status")? != "up" {
                    return Ok(false);
                }
            }
            for node in nodes {
                if node.info_field("cluster-info", "cluster_state")? != "ok" {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }

    /// `redis+cluster://` seeds: the nodes `which` names.
    pub fn url(&self, which: &[usize], params: &str) -> String {
        let seeds: Vec<String> = which
            .iter()
            .map(|&i| self.nodes[i].addr().to_string())
            .collect();
        format!("redis+cluster://{}{params}", seeds.join(","))
    }

    /// The hash slot of each of `keys` (`CLUSTER KEYSLOT`, one pipeline on node 1).
    pub fn slots(&self, keys: &[String]) -> Result<Vec<u16>, BoxError> {
        let client = redis::Client::open(self.nodes[1].url().as_str())?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(1))?;
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("CLUSTER").arg("KEYSLOT").arg(key);
        }
        Ok(pipe.query(&mut conn)?)
    }

    /// Whether node `i` is a primary (`role:master`); `None` when it does not answer.
    pub fn is_primary(&self, i: usize) -> Option<bool> {
        self.nodes[i]
            .info_field("replication", "role")
            .ok()
            .map(|r| r == "master")
    }
}

/// Poll `done` every 50 ms for up to 60 s; an error naming `what` if it never holds.
pub fn wait_until(
    what: &str,
    mut done: impl FnMut() -> Result<bool, BoxError>,
) -> Result<(), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if done().unwrap_or(false) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("the Redis Cluster: not within 60 s: {what}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
