//! Redis in the chaos harness: the store lives in a private `redis-server` of the run
//! (`appendonly yes`, `appendfsync always`), SIGKILLed and restarted once. Lease mode
//! only: Redis has no transaction an effect row could join.
//!
//! Failover runs: a primary with two replicas, the store behind a [`SwitchingProxy`];
//! the primary is SIGKILLed and the replica with the highest replication offset promoted
//! (`REPLICAOF NO ONE`), the other pointed at it, as Sentinel does; with
//! `DEDUP_CHAOS_REDIS_SENTINEL=1`, three real sentinels elect and promote the replica and
//! the front follows the primary they name ([`Sentinels`]), as a Sentinel-aware proxy
//! does. "Sync" replication is the store's `WAIT` after each commit (`wait_replicas=1`).
//!
//! The servers are [`RedisServer`]s (`redis-server`, or the binary
//! `DEDUP_CHAOS_REDIS_SERVER` names).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::{BoxError, ChaosBackend, Restart, StoreServer};
use crate::Replication;
use crate::proxy::SwitchingProxy;
use crate::redis_sentinel::{self as sentinel, Sentinels};
use crate::redis_server::RedisServer;

/// The Redis chaos module, chosen by the store URL's descriptor.
pub(super) static CHAOS: ChaosBackend = ChaosBackend {
    descriptor: &dedup_redis::DESCRIPTOR,
    start: |dir, _| {
        let server = RedisServer::start(&dir.join("redis"), &[])?;
        let url = server.url();
        let server = Mutex::new(server);
        Ok(StoreServer {
            url,
            restart: Some(Restart {
                name: "redis",
                crash_restart: Arc::new(move || {
                    server
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .kill_and_restart()
                }),
            }),
        })
    },
    transactional: None,
    failover: Some(failover),
};

/// [`ChaosBackend::failover`]: a primary and two replicas in `dir`, the store behind a
/// front on the primary (with `WAIT 1` after each commit for [`Replication::Sync`]).
fn failover(dir: &Path, replication: Replication) -> Result<StoreServer, BoxError> {
    let wait = match replication {
        Replication::Async => "",
        Replication::Sync => "?wait_replicas=1&wait_timeout=1s",
        Replication::RemoteApply => {
            return Err("remote-apply is PostgreSQL's; Redis runs async or sync (WAIT)".into());
        }
    };
    let primary = RedisServer::start(&dir.join("redis-primary"), &[])?;
    let of_primary = [
        "--replicaof".into(),
        "127.0.0.1".into(),
        primary.port.to_string(),
    ];
    let replicas = [
        RedisServer::start(&dir.join("redis-replica-1"), &of_primary)?,
        RedisServer::start(&dir.join("redis-replica-2"), &of_primary)?,
    ];
    for replica in &replicas {
        replica.wait_for_link()?;
    }
    let proxy = SwitchingProxy::start(SocketAddr::from(([127, 0, 0, 1], 0)), primary.addr())?;
    let url = format!("redis://{}/{wait}", proxy.addr());
    if sentinel::chosen() {
        let sentinels = Sentinels::start(&dir.join("sentinel"), &primary, replicas.len())?;
        let servers = Mutex::new((primary, replicas, sentinels));
        return Ok(StoreServer {
            url,
            restart: Some(Restart {
                name: "failover",
                crash_restart: Arc::new(move || {
                    let mut servers = servers.lock().unwrap_or_else(|p| p.into_inner());
                    let (primary, _, sentinels) = &mut *servers;
                    let old = primary.addr();
                    primary.kill();
                    proxy.switch(sentinels.wait_for_new_primary(old)?);
                    Ok(())
                }),
            }),
        });
    }
    let servers = Mutex::new((primary, replicas));
    Ok(StoreServer {
        url,
        restart: Some(Restart {
            name: "failover",
            crash_restart: Arc::new(move || {
                let mut servers = servers.lock().unwrap_or_else(|p| p.into_inner());
                let (primary, replicas) = &mut *servers;
                primary.kill();
                let offsets = [replicas[0].replica_offset()?, replicas[1].replica_offset()?];
                let (new, other) = if offsets[0] >= offsets[1] {
                    (0, 1)
                } else {
                    (1, 0)
                };
                replicas[new].command(&["REPLICAOF", "NO", "ONE"])?;
                let port = replicas[new].port.to_string();
                replicas[other].command(&["REPLICAOF", "127.0.0.1", &port])?;
                proxy.switch(replicas[new].addr());
                Ok(())
            }),
        }),
    })
}
