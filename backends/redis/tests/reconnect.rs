//! The store survives its connections being killed (`CLIENT KILL`) and the server forgetting
//! its scripts (`SCRIPT FLUSH`, as after a restart or failover). Standalone and cluster.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::{Target, config};
use dedup_core::{
    Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Key, ManualClock, RecordState,
};
use dedup_redis::RedisStore;
use dedup_redis::redis::{self, aio::MultiplexedConnection};

/// The tests of this file run one at a time: the kill test kills every connection opened
/// while it runs, which would include the other test's.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A plain connection to each node of `target` (the cluster's masters, or the one server).
async fn node_connections(target: &Target) -> Vec<MultiplexedConnection> {
    let mut out = Vec::new();
    for url in target.node_urls() {
        out.push(
            redis::Client::open(url.as_str())
                .expect("url")
                .get_multiplexed_async_connection()
                .await
                .expect("node connection"),
        );
    }
    out
}

/// The client ids connected to one node.
async fn client_ids(conn: &mut MultiplexedConnection) -> HashSet<i64> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .expect("CLIENT LIST");
    list.lines()
        .filter_map(|line| line.strip_prefix("id="))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect()
}

/// After the kill, one operation may fail (retryably) while the store notices; the next one
/// must succeed.
async fn recovers(store: &RedisStore, key: &Key, target: &Target) {
    let first = store.claim(key, &ClaimOptions::default()).await;
    eprintln!(
        "{}: first operation after the kill: {first:?}",
        target.name()
    );
    match first {
        Ok(claim) => assert!(claim.is_acquired(), "{claim:?}"),
        Err(e) => assert!(
            e.is_retryable(),
            "{}: the first operation after the kill may fail, but retryably: {e:?}",
            target.name()
        ),
    }
    let record = store.get(key).await.unwrap_or_else(|e| {
        panic!(
            "{}: the second operation must succeed: {e:?}",
            target.name()
        )
    });
    // Whether the first claim's reply was lost or not, a retry is safe.
    match store.claim(key, &ClaimOptions::default()).await.unwrap() {
        Claim::Acquired(_) => assert!(record.is_none(), "the first claim landed: {record:?}"),
        Claim::InFlight { .. } => assert!(record.is_some()),
        other => panic!("{other:?}"),
    }
}

/// Claims of `n` fresh keys named `{name}-{i}` in one batch (over many slots in a cluster).
async fn claim_batch(store: &RedisStore, name: &str, n: usize) -> dedup_core::Result<usize> {
    let requests: Vec<ClaimRequest> = (0..n)
        .map(|i| {
            let key = Key::new("reconnect", format!("{name}-{i}")).unwrap();
            ClaimRequest::new(key, ClaimOptions::default())
        })
        .collect();
    let claims = store.claim_many(&requests).await?;
    Ok(claims
        .into_iter()
        .filter(|c| matches!(c, Ok(Claim::Acquired(_))))
        .count())
}

/// After the kill, one batch may fail (retryably) while the store notices (in a cluster, the
/// batches' own connections to the primaries); the next one must succeed.
async fn batches_recover(store: &RedisStore, target: &Target) {
    let name = target.name();
    let first = claim_batch(store, "after-kill-1", 50).await;
    eprintln!("{name}: first batch after the kill: {first:?}");
    match first {
        Ok(acquired) => assert_eq!(acquired, 50, "{name}"),
        Err(e) => assert!(
            e.is_retryable(),
            "{name}: the first batch after the kill may fail, but retryably: {e:?}"
        ),
    }
    let acquired = claim_batch(store, "after-kill-2", 50)
        .await
        .unwrap_or_else(|e| panic!("{name}: the second batch must succeed: {e:?}"));
    assert_eq!(acquired, 50, "{name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_is_replaced() {
    let _serial = SERIAL.lock().await;
    for target in Target::all("a_killed_connection_is_replaced") {
        let clock = Arc::new(ManualClock::starting_now());
        let mut nodes = node_connections(&target).await;
        let mut before = Vec::new();
        for n in &mut nodes {
            before.push(client_ids(n).await);
        }
        let store = target.open(config("reconnect", &clock)).await;
        let key = Key::new("reconnect", "m1").unwrap();
        assert!(store.get(&key).await.unwrap().is_none());
        // A batch over many slots, so that a cluster store's batch connections are open too.
        assert_eq!(
            claim_batch(&store, "before-kill", 50).await.unwrap(),
            50,
            "{}",
            target.name()
        );

        let mut killed = 0;
        for (n, old) in nodes.iter_mut().zip(&before) {
            for id in client_ids(n).await.difference(old) {
                let _: redis::Value = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("ID")
                    .arg(*id)
                    .query_async(n)
                    .await
                    .expect("CLIENT KILL");
                killed += 1;
            }
        }
        assert!(
            killed >= 1,
            "{}: found no connection of the store",
            target.name()
        );
        recovers(&store, &key, &target).await;
        batches_recover(&store, &target).await;
    }
}

async fn flush_scripts(nodes: &mut [MultiplexedConnection]) {
    for n in nodes {
        let _: redis::Value = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(n)
            .await
            .expect("SCRIPT FLUSH");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_scripts_are_loaded_again() {
    let _serial = SERIAL.lock().await;
    for target in Target::all("flushed_scripts_are_loaded_again") {
        let clock = Arc::new(ManualClock::starting_now());
        let store = target.open(config("script_flush", &clock)).await;
        let mut nodes = node_connections(&target).await;
        // A single operation.
        flush_scripts(&mut nodes).await;
        let k1 = Key::new("flush", "single").unwrap();
        assert!(
            store
                .claim(&k1, &ClaimOptions::default())
                .await
                .unwrap()
                .is_acquired()
        );
        // A batch (one EVALSHA per batch, or per slot group in a cluster).
        flush_scripts(&mut nodes).await;
        let requests: Vec<ClaimRequest> = (0..20)
            .map(|i| {
                ClaimRequest::new(
                    Key::new("flush", format!("b{i}")).unwrap(),
                    ClaimOptions::default(),
                )
            })
            .collect();
        let claims = store.claim_many(&requests).await.unwrap();
        assert!(
            claims.iter().all(|c| matches!(c, Ok(Claim::Acquired(_)))),
            "{}: {claims:?}",
            target.name()
        );
        // A batch of commits, its script flushed too.
        flush_scripts(&mut nodes).await;
        let commits: Vec<CommitRequest> = claims
            .into_iter()
            .map(|c| match c {
                Ok(Claim::Acquired(lease)) => CommitRequest {
                    lease,
                    outcome: Some(b"done".to_vec()),
                },
                other => panic!("{other:?}"),
            })
            .collect();
        let committed = store.commit_many(&commits).await.unwrap();
        assert!(
            committed.iter().all(Result::is_ok),
            "{}: {committed:?}",
            target.name()
        );
        let record = store.get(&commits[0].lease.key).await.unwrap();
        assert!(
            matches!(
                record.map(|r| r.state),
                Some(RecordState::Completed { outcome: Some(ref o), .. }) if o == b"done"
            ),
            "{}: the batch commit was not applied",
            target.name()
        );
    }
}
