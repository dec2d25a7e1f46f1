//! The holder's one-command operations (`SET ... IFEQ`, Valkey; see `src/held.rs`) when the
//! key no longer holds the value the store wrote: each answer is the script's, on every
//! server (Redis 7 runs the scripts throughout, which is the reference). A record rewritten
//! behind the store's back by another process's renewal is still committed; a deleted key is
//! `LeaseLost`; a layout-1 hash (`WRONGTYPE` to the plain command) is judged by the script;
//! a renewal through the fast path keeps later commits on it, on both clocks.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{RETENTION, Raw, Target, config, unique_prefix};
use dedup_core::{
    ClaimOptions, DedupStore, Error, Key, Lease, ManualClock, RecordState, Timestamp,
};
use dedup_redis::redis::{self, Value};
use dedup_redis::{RedisConfig, RedisStore};

const MINUTE: Duration = Duration::from_secs(60);

async fn claim(store: &RedisStore, key: &Key) -> Lease {
    store
        .claim(key, &ClaimOptions::lease(MINUTE))
        .await
        .unwrap()
        .into_lease()
        .expect("acquired")
}

async fn completed(store: &RedisStore, key: &Key, what: &str) -> Option<Vec<u8>> {
    match store.get(key).await.unwrap().map(|r| r.state) {
        Some(RecordState::Completed { outcome, .. }) => outcome,
        other => panic!("{what}: expected completed, got {other:?}"),
    }
}

async fn value(raw: &mut Raw, redis_key: &str) -> Value {
    raw.run(redis::cmd("GET").arg(redis_key)).await
}

/// Both clocks: the server's (relative `l` records) and an injected one (`i` records).
async fn stores(target: &Target, test: &str) -> Vec<(&'static str, RedisStore, RedisStore)> {
    let server = RedisConfig {
        prefix: unique_prefix(test),
        retention: RETENTION,
        ..RedisConfig::default()
    };
    let injected = config(test, &Arc::new(ManualClock::starting_now()));
    let mut out = Vec::new();
    for (clock, config) in [("server clock", server), ("injected clock", injected)] {
        // Two stores on one prefix: two processes, each remembering only its own leases.
        let a = target.open(config.clone()).await;
        let b = target.open(config).await;
        out.push((clock, a, b));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_value_changed_gets_the_scripts_answer() {
    for target in Target::all("a_holder_whose_value_changed_gets_the_scripts_answer") {
        for (clock, a, b) in stores(&target, "set_ifeq").await {
            let name = format!("{}, {clock}", target.name());
            let mut raw = target.raw().await;

            // Renewed by another process (a script there: it does not know the value), then
            // committed here: the plain command finds another value, the script commits.
            let key = Key::new("ifeq", "renewed-elsewhere").unwrap();
            let lease = claim(&a, &key).await;
            let renewed = b.renew(&lease, 2 * MINUTE).await.unwrap();
            assert_eq!((renewed.fence, renewed.attempt), (1, 1), "{name}");
            a.commit(&lease, Some(b"one")).await.unwrap();
            assert_eq!(
                completed(&a, &key, &name).await.as_deref(),
                Some(&b"one"[..]),
                "{name}"
            );
            // The same commit again: the script's "already committed by this token".
            a.commit(&lease, Some(b"one")).await.unwrap();

            // Renewed here (the plain command when the server has it), twice, then
            // committed here: each step finds the value the previous one wrote.
            let key = Key::new("ifeq", "renewed-here").unwrap();
            let lease = claim(&a, &key).await;
            let first = a.renew(&lease, 2 * MINUTE).await.unwrap();
            let second = a.renew(&first, 3 * MINUTE).await.unwrap();
            assert!(second.expires_at > first.expires_at, "{name}: {second:?}");
            match a.get(&key).await.unwrap().map(|r| r.state) {
                Some(RecordState::InFlight { expires_at, .. }) => {
                    assert_eq!(expires_at, second.expires_at, "{name}")
                }
                other => panic!("{name}: {other:?}"),
            }
            a.commit(&second, None).await.unwrap();
            assert_eq!(completed(&a, &key, &name).await, None, "{name}");
            // A renewal after the commit: the value is no longer the one written.
            assert!(
                matches!(a.renew(&second, MINUTE).await, Err(Error::LeaseLost { .. })),
                "{name}"
            );

            // The key deleted behind the store's back: LeaseLost, and nothing written.
            for op in ["commit", "renew", "release"] {
                let key = Key::new("ifeq", format!("deleted-{op}")).unwrap();
                let lease = claim(&a, &key).await;
                let redis_key = a.redis_key(&key);
                raw.run(redis::cmd("DEL").arg(&redis_key)).await;
                let result = match op {
                    "commit" => a.commit(&lease, Some(b"x")).await.map(|_| ()),
                    "renew" => a.renew(&lease, MINUTE).await.map(|_| ()),
                    _ => a.release(&lease).await,
                };
                assert!(
                    matches!(result, Err(Error::LeaseLost { .. })),
                    "{name}, {op}: {result:?}"
                );
                assert_eq!(
                    value(&mut raw, &redis_key).await,
                    Value::Nil,
                    "{name}, {op}"
                );
            }

            // A layout-1 hash holding the lease (WRONGTYPE to the plain command): the
            // script reads it and commits, rewriting it as layout 2.
            let key = Key::new("ifeq", "now-a-hash").unwrap();
            let lease = claim(&a, &key).await;
            let redis_key = a.redis_key(&key);
            let far = Timestamp::from_millis(lease.expires_at.as_millis() + 3_600_000);
            raw.run(redis::cmd("DEL").arg(&redis_key)).await;
            let mut hset = redis::cmd("HSET");
            hset.arg(&redis_key)
                .arg("state")
                .arg("i")
                .arg("token")
                .arg(lease.token.to_string())
                .arg("fence")
                .arg(1)
                .arg("attempt")
                .arg(1)
                .arg("expires_at")
                .arg(lease.expires_at.as_millis())
                .arg("retain_until")
                .arg(far.as_millis() + RETENTION.as_millis() as i64);
            raw.run(&hset).await;
            a.commit(&lease, Some(b"h")).await.unwrap();
            assert_eq!(
                completed(&a, &key, &name).await.as_deref(),
                Some(&b"h"[..]),
                "{name}"
            );
            match value(&mut raw, &redis_key).await {
                Value::BulkString(v) => assert!(v.starts_with(b"2,"), "{name}: {v:?}"),
                other => panic!("{name}: {other:?}"),
            }

            // Released here, then claimed again: the next fence, and the released lease's
            // commit is lost.
            let key = Key::new("ifeq", "released").unwrap();
            let lease = claim(&a, &key).await;
            a.release(&lease).await.unwrap();
            let next = claim(&b, &key).await;
            assert_eq!((next.fence, next.attempt), (2, 2), "{name}");
            assert!(
                matches!(a.commit(&lease, None).await, Err(Error::LeaseLost { .. })),
                "{name}"
            );
            b.commit(&next, Some(b"second")).await.unwrap();
            assert_eq!(
                completed(&b, &key, &name).await.as_deref(),
                Some(&b"second"[..]),
                "{name}"
            );
        }
    }
}

/// A batch commit mixes remembered leases (one `SET ... IFEQ` each, pipelined), a lease
/// another store claimed, a deleted key and the same lease twice: each item is what the
/// single commit answers, on every server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_commit_answers_each_item_as_the_single_commit() {
    use dedup_core::CommitRequest;
    for target in Target::all("a_batch_commit_answers_each_item_as_the_single_commit") {
        for (clock, a, b) in stores(&target, "set_ifeq_batch").await {
            let name = format!("{}, {clock}", target.name());
            let mut raw = target.raw().await;
            let keys: Vec<Key> = (0..6)
                .map(|i| Key::new("ifeq-batch", format!("m{i}")).unwrap())
                .collect();
            let mut leases = Vec::new();
            for (i, key) in keys.iter().enumerate() {
                // m3 is claimed by the other store: this one does not know its value.
                let store = if i == 3 { &b } else { &a };
                leases.push(claim(store, key).await);
            }
            // m4's key is deleted; m5 was renewed by the other store (another value).
            raw.run(redis::cmd("DEL").arg(a.redis_key(&keys[4]))).await;
            b.renew(&leases[5], MINUTE).await.unwrap();
            let mut requests: Vec<CommitRequest> = leases
                .iter()
                .enumerate()
                .map(|(i, l)| CommitRequest {
                    lease: l.clone(),
                    outcome: Some(format!("out{i}").into_bytes()),
                })
                .collect();
            // m0 twice.
            requests.push(CommitRequest {
                lease: leases[0].clone(),
                outcome: Some(b"out0".to_vec()),
            });
            let results = a.commit_many(&requests).await.unwrap();
            assert_eq!(results.len(), 7, "{name}");
            for (i, result) in results.iter().enumerate() {
                if i == 4 {
                    assert!(
                        matches!(result, Err(Error::LeaseLost { .. })),
                        "{name}, item {i}: {result:?}"
                    );
                } else {
                    assert!(result.is_ok(), "{name}, item {i}: {result:?}");
                }
            }
            for (i, key) in keys.iter().enumerate() {
                if i == 4 {
                    assert_eq!(a.get(key).await.unwrap(), None, "{name}");
                } else {
                    let outcome = completed(&a, key, &name).await;
                    assert_eq!(
                        outcome,
                        Some(format!("out{i}").into_bytes()),
                        "{name}, m{i}"
                    );
                }
            }
        }
    }
}
