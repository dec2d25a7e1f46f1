//! A batch reaches each node as one pipeline (one request per primary, not one per hash
//! slot), and a stale slot map costs redirections but never a command run twice or lost.
//! Counted with `INFO commandstats` and `INFO errorstats` (deltas summed over every node):
//! this file holds one test so that, in its process, nothing else of this suite talks to the
//! servers while it counts (the servers are the test run's own, from `scripts/services.sh`).

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{RETENTION, Target, command_calls, counts, info_counts, unique_prefix};
use dedup_core::{Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Key, Lease};
use dedup_redis::redis::cluster_routing::Slot;
use dedup_redis::{RedisConfig, RedisStore};

const N: usize = 1000;

/// Claims `keys` in one batch; every one must be acquired.
async fn claim_fresh(store: &RedisStore, keys: &[Key], what: &str) -> Vec<Lease> {
    let options = ClaimOptions::lease(Duration::from_secs(60));
    let requests: Vec<ClaimRequest> = keys
        .iter()
        .map(|k| ClaimRequest::new(k.clone(), options.clone()))
        .collect();
    let claims = store.claim_many(&requests).await.expect("claim_many");
    assert_eq!(claims.len(), keys.len(), "{what}");
    claims
        .into_iter()
        .map(|c| match c.expect("claim") {
            Claim::Acquired(lease) => lease,
            other => panic!("{what}: a fresh key was not acquired: {other:?}"),
        })
        .collect()
}

/// Commits `leases` in one batch; every one must succeed.
async fn commit_all(store: &RedisStore, leases: &[Lease], what: &str) {
    let commits: Vec<CommitRequest> = leases
        .iter()
        .map(|lease| CommitRequest {
            lease: lease.clone(),
            outcome: Some(b"done".to_vec()),
        })
        .collect();
    let results = store.commit_many(&commits).await.expect("commit_many");
    assert_eq!(results.len(), leases.len(), "{what}");
    for r in results {
        r.unwrap_or_else(|e| panic!("{what}: {e:?}"));
    }
}

/// `MOVED` replies so far, over every node.
async fn moved(target: &Target) -> u64 {
    let errors = info_counts(target, "errorstats", "errorstat_", "count").await;
    errors.get("MOVED").copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_one_pipeline_per_node_and_survives_a_stale_slot_map() {
    for target in Target::all("a_batch_is_one_pipeline_per_node_and_survives_a_stale_slot_map") {
        let name = &target.name();
        let cluster = target.is_cluster();
        let store = target
            .open(RedisConfig {
                prefix: unique_prefix("node_pipelines"),
                retention: RETENTION,
                // Every pipeline of a commit batch ends with one WAIT: counting WAITs counts
                // pipelines. No replica is asked for, so it answers at once.
                wait_for_replicas: Some((0, Duration::from_millis(100))),
                ..RedisConfig::default()
            })
            .await;
        // Every seed node of the test cluster is a primary.
        let nodes = target.node_urls().len() as u64;
        let batch = |round: &str| -> (Vec<Key>, u64) {
            let keys: Vec<Key> = (0..N)
                .map(|i| Key::new("node-pipelines", format!("{round}-{i}")).unwrap())
                .collect();
            let slots: HashSet<Slot> = keys
                .iter()
                .map(|k| Slot::for_key(store.redis_key(k)))
                .collect();
            // One script call per slot in a cluster; one for the whole batch otherwise.
            let scripts = if cluster { slots.len() as u64 } else { 1 };
            (keys, scripts)
        };

        // A map read from the cluster: one pipeline per node.
        let (keys, scripts) = batch("fresh-map");
        let leases = claim_fresh(&store, &keys, name).await;
        let before = command_calls(&target).await;
        commit_all(&store, &leases, name).await;
        let after = command_calls(&target).await;
        counts(
            &before,
            &after,
            &[("evalsha", scripts), ("wait", nodes)],
            &format!("{name}: a commit batch of {N} keys (script calls per slot, WAITs per node)"),
        );
        assert!(
            !cluster || scripts > 10 * nodes,
            "{name}: {scripts} slots: the keys should spread over many slots"
        );

        // A stale map: every slot taken for another node's. Each command is redirected,
        // runs again through the cluster client, exactly once, and the map is read again.
        let (keys, scripts) = batch("stale-map");
        store.misroute_slots().await.expect("misroute_slots");
        let moved_before = moved(&target).await;
        let leases = claim_fresh(&store, &keys, &format!("{name}, stale map")).await;
        let moved_claims = moved(&target).await - moved_before;
        let expected_moved = if cluster { N as u64 } else { 0 };
        assert!(
            moved_claims >= expected_moved && (cluster || moved_claims == 0),
            "{name}: {moved_claims} MOVED replies to a claim batch on a wrong map, expected at \
             least {expected_moved}"
        );
        let before = command_calls(&target).await;
        let moved_before = moved(&target).await;
        commit_all(&store, &leases, &format!("{name}, after a stale map")).await;
        let after = command_calls(&target).await;
        assert_eq!(
            moved(&target).await - moved_before,
            0,
            "{name}: the map was read again after the redirections"
        );
        counts(
            &before,
            &after,
            &[("evalsha", scripts), ("wait", nodes)],
            &format!("{name}: commits after a stale map"),
        );

        // A stale map under a commit batch with a replica wait: the redirected script calls
        // run once each, and each node's pipeline, having re-run calls, waits again (a WAIT
        // sent through the cluster client goes to every primary).
        let (keys, scripts) = batch("stale-commit");
        let leases = claim_fresh(&store, &keys, name).await;
        store.misroute_slots().await.expect("misroute_slots");
        let before = command_calls(&target).await;
        let moved_before = moved(&target).await;
        commit_all(&store, &leases, &format!("{name}, commits on a stale map")).await;
        let after = command_calls(&target).await;
        let moved_commits = moved(&target).await - moved_before;
        let (expected_moved, waits) = if cluster {
            (scripts, nodes + nodes * nodes)
        } else {
            (0, 1)
        };
        assert_eq!(
            moved_commits, expected_moved,
            "{name}: every commit script call on a wrong map is redirected once"
        );
        counts(
            &before,
            &after,
            &[("evalsha", scripts), ("wait", waits)],
            &format!("{name}: commits on a stale map run once each, then WAIT again"),
        );

        // Every record of the three rounds is completed.
        for round in ["fresh-map", "stale-map", "stale-commit"] {
            let (keys, _) = batch(round);
            for key in &keys {
                let record = store.get(key).await.unwrap().expect("a record");
                assert!(
                    matches!(record.state, dedup_core::RecordState::Completed { .. }),
                    "{name}: {key:?} is {record:?}"
                );
            }
        }
    }
}
