//! A regression guard on what each operation costs on the wire: exact round trips and
//! commands (counted as statements) per operation, on standalone Redis and Valkey, counted
//! by a [`CountingProxy`](dedup_conformance::counting::CountingProxy) between one store
//! and the server (see BENCHMARKS.md, "Wire cost guard"). `round_trips.rs` says which
//! commands run; this file pins how many round trips and commands each operation takes,
//! the batches included. A change that adds a round trip or a command fails
//! here with the operation's name; if the change is meant, update the number here and the
//! table in BENCHMARKS.md.
//!
//! The purge is not pinned: its steps scan the server's whole keyspace under a time budget,
//! so how many steps fill a batch depends on every other key on the server.
//!
//! Deterministic: only this store talks through the proxy, on its one multiplexed
//! connection; every operation runs once on other keys before it is measured (the first
//! use of a script loads it), and operations run one at a time. Clusters are not measured:
//! their clients follow the nodes' own addresses, past a single proxy.

mod common;

use common::{RETENTION, Server, Target, unique_prefix};
use dedup_conformance::counting::{
    Cost, CostGuard, CountingProxy, LeaseCosts, Protocol, check_lease_mode,
};
use dedup_redis::RedisConfig;

/// The expected cost of each operation measured below, on a server without
/// `SET ... IFEQ` (Redis 7: scripts) and with it (Valkey).
const SCRIPTS: LeaseCosts = LeaseCosts {
    claim_fresh: Cost::new(1, 2, 0),
    claim_in_flight: Cost::new(2, 3, 0),
    claim_completed: Cost::new(1, 2, 0),
    claim_expired: Cost::new(2, 3, 0),
    renew: Cost::new(1, 1, 0),
    commit: Cost::new(1, 1, 0),
    release: Cost::new(1, 1, 0),
    claim_many_100: Cost::new(1, 200, 0),
    commit_many_100: Cost::new(1, 1, 0),
};

const SET_IFEQ: LeaseCosts = LeaseCosts {
    claim_fresh: Cost::new(1, 2, 0),
    claim_in_flight: Cost::new(2, 3, 0),
    claim_completed: Cost::new(1, 2, 0),
    claim_expired: Cost::new(2, 3, 0),
    renew: Cost::new(1, 4, 0),
    commit: Cost::new(1, 1, 0),
    release: Cost::new(1, 1, 0),
    claim_many_100: Cost::new(1, 200, 0),
    commit_many_100: Cost::new(1, 100, 0),
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operation_costs_what_it_did() {
    for target in Target::standalones("each_operation_costs_what_it_did") {
        let Target::Standalone(server, url) = &target else {
            unreachable!("standalones")
        };
        let (backend, expected) = match server {
            Server::Redis => ("redis", &SCRIPTS),
            Server::Valkey => ("valkey", &SET_IFEQ),
        };
        let (proxy, through) = CountingProxy::for_url(url, Protocol::Resp)
            .await
            .expect("start the counting proxy");
        let store = Target::Standalone(*server, through)
            .open(RedisConfig {
                prefix: unique_prefix("op_counts"),
                retention: RETENTION,
                ..RedisConfig::default()
            })
            .await;
        let mut g = CostGuard::new(backend, proxy, || true);
        check_lease_mode(&mut g, &store, expected).await;
        g.finish();
    }
}
