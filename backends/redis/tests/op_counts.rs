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

use std::time::Duration;

use common::{RETENTION, Server, Target, unique_prefix};
use dedup_conformance::counting::{Cost, CostGuard, CountingProxy, Protocol};
use dedup_core::{
    Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, ItemResult, Key, Lease,
};
use dedup_redis::RedisConfig;

/// The expected cost of each operation measured below, on a server without
/// `SET ... IFEQ` (Redis 7: scripts) and with it (Valkey).
struct Expected {
    claim_fresh: Cost,
    claim_in_flight: Cost,
    claim_completed: Cost,
    renew: Cost,
    commit: Cost,
    release: Cost,
    claim_many_100: Cost,
    commit_many_100: Cost,
}

const SCRIPTS: Expected = Expected {
    claim_fresh: Cost::new(1, 2, 0),
    claim_in_flight: Cost::new(2, 3, 0),
    claim_completed: Cost::new(1, 2, 0),
    renew: Cost::new(1, 1, 0),
    commit: Cost::new(1, 1, 0),
    release: Cost::new(1, 1, 0),
    claim_many_100: Cost::new(1, 200, 0),
    commit_many_100: Cost::new(1, 1, 0),
};

const SET_IFEQ: Expected = Expected {
    claim_fresh: Cost::new(1, 2, 0),
    claim_in_flight: Cost::new(2, 3, 0),
    claim_completed: Cost::new(1, 2, 0),
    renew: Cost::new(1, 4, 0),
    commit: Cost::new(1, 1, 0),
    release: Cost::new(1, 1, 0),
    claim_many_100: Cost::new(1, 200, 0),
    commit_many_100: Cost::new(1, 100, 0),
};

fn key(id: &str) -> Key {
    Key::new("op-counts", id).unwrap()
}

fn acquired(claim: Claim) -> Lease {
    match claim {
        Claim::Acquired(lease) => lease,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

fn hundred(prefix: &str, options: &ClaimOptions) -> Vec<ClaimRequest> {
    (0..100)
        .map(|i| ClaimRequest::new(key(&format!("{prefix}{i}")), options.clone()))
        .collect()
}

fn commits(claims: Vec<ItemResult<Claim>>) -> Vec<CommitRequest> {
    claims
        .into_iter()
        .map(|c| CommitRequest {
            lease: acquired(c.expect("claimed")),
            outcome: Some(b"done".to_vec()),
        })
        .collect()
}

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
        let options = ClaimOptions::lease(Duration::from_secs(30));

        // One key at a time: warm up on "w*", measure on "a" / "b".
        let warm = acquired(store.claim(&key("w1"), &options).await.unwrap());
        let lease = acquired(
            g.check(
                "claim of a fresh key",
                expected.claim_fresh,
                store.claim(&key("a"), &options),
            )
            .await
            .unwrap(),
        );
        store.claim(&key("w1"), &options).await.unwrap();
        let claim = g
            .check(
                "claim of a key in flight",
                expected.claim_in_flight,
                store.claim(&key("a"), &options),
            )
            .await
            .unwrap();
        assert!(matches!(claim, Claim::InFlight { .. }), "{claim:?}");
        let warm = store.renew(&warm, Duration::from_secs(60)).await.unwrap();
        let lease = g
            .check(
                "renew",
                expected.renew,
                store.renew(&lease, Duration::from_secs(60)),
            )
            .await
            .unwrap();
        store.commit(&warm, Some(b"done")).await.unwrap();
        g.check(
            "commit",
            expected.commit,
            store.commit(&lease, Some(b"done")),
        )
        .await
        .unwrap();
        store.claim(&key("w1"), &options).await.unwrap();
        let claim = g
            .check(
                "claim of a completed key",
                expected.claim_completed,
                store.claim(&key("a"), &options),
            )
            .await
            .unwrap();
        assert!(matches!(claim, Claim::Completed { .. }), "{claim:?}");
        let warm = acquired(store.claim(&key("w2"), &options).await.unwrap());
        let lease = acquired(store.claim(&key("b"), &options).await.unwrap());
        store.release(&warm).await.unwrap();
        g.check("release", expected.release, store.release(&lease))
            .await
            .unwrap();

        // Batches of 100.
        let warm = store.claim_many(&hundred("wm", &options)).await.unwrap();
        let requests = hundred("m", &options);
        let claimed = g
            .check(
                "claim_many of 100 keys",
                expected.claim_many_100,
                store.claim_many(&requests),
            )
            .await
            .unwrap();
        store.commit_many(&commits(warm)).await.unwrap();
        let requests = commits(claimed);
        for done in g
            .check(
                "commit_many of 100 keys",
                expected.commit_many_100,
                store.commit_many(&requests),
            )
            .await
            .unwrap()
        {
            done.expect("committed");
        }

        g.finish();
    }
}
