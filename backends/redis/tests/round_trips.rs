//! What the server runs per operation, counted with `INFO commandstats` (deltas, summed over
//! every node of a cluster): a claim of a fresh key and a duplicate's claim run no script,
//! a renewal is one script on Redis 7 and one `SET ... IFEQ` with `PEXPIRETIME` in a
//! transaction on Valkey, a commit one compact script on Redis 7 (`GET`, `SET`: on the
//! server's clock it reads no clock, the key's expiry holds processed_at) and one `SET ...
//! IFEQ` on Valkey, and a duplicate is answered
//! from the claim's one round trip. This file holds one test so that, in its process,
//! nothing else of this suite talks to the servers while it counts (the servers are the
//! test run's own, from `scripts/services.sh`).

mod common;

use std::time::Duration;

use common::{RETENTION, Target, command_calls, counts, unique_prefix};
use dedup_core::{Claim, ClaimOptions, DedupStore, Error, Fingerprint, Key};
use dedup_redis::RedisConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_run_no_script_and_a_commit_one_compact_script() {
    const N: u64 = 20;
    for target in Target::all("claims_run_no_script_and_a_commit_one_compact_script") {
        let name = &target.name();
        let store = target
            .open(RedisConfig {
                prefix: unique_prefix("round_trips"),
                retention: RETENTION,
                ..RedisConfig::default()
            })
            .await;
        let fp = Fingerprint::new("payload-1").unwrap();
        let options = ClaimOptions::lease(Duration::from_secs(30)).with_fingerprint(fp);
        let keys: Vec<Key> = (0..N)
            .map(|i| Key::new("round-trips", format!("m{i}")).unwrap())
            .collect();

        // Fresh claims, then commits.
        let before = command_calls(&target).await;
        let mut leases = Vec::new();
        for key in &keys {
            match store.claim(key, &options).await.unwrap() {
                Claim::Acquired(lease) => leases.push(lease),
                other => panic!("{name}: {other:?}"),
            }
        }
        let claimed = command_calls(&target).await;
        for lease in &mut leases {
            *lease = store.renew(lease, Duration::from_secs(60)).await.unwrap();
        }
        let renewed = command_calls(&target).await;
        for lease in &leases {
            store.commit(lease, Some(b"done")).await.unwrap();
        }
        let committed = command_calls(&target).await;
        let what = format!("{name}, fresh claims");
        counts(
            &before,
            &claimed,
            &[("evalsha", 0), ("set", N), ("pexpiretime", N)],
            &what,
        );
        if target.server().has_set_ifeq() {
            let what = format!("{name}, renewals: one SET ... IFEQ and PEXPIRETIME, atomic");
            counts(
                &claimed,
                &renewed,
                &[
                    ("evalsha", 0),
                    ("multi", N),
                    ("set", N),
                    ("pexpiretime", N),
                    ("exec", N),
                    ("get", 0),
                    ("time", 0),
                ],
                &what,
            );
            let what = format!("{name}, commits: one SET ... IFEQ each");
            counts(
                &renewed,
                &committed,
                &[("evalsha", 0), ("get", 0), ("set", N), ("time", 0)],
                &what,
            );
        } else {
            let what = format!("{name}, renewals: one script each");
            counts(
                &claimed,
                &renewed,
                &[("evalsha", N), ("get", N), ("time", N), ("set", N)],
                &what,
            );
            let what = format!("{name}, commits: one script reading and writing once");
            counts(
                &renewed,
                &committed,
                &[("evalsha", N), ("get", N), ("set", N), ("time", 0)],
                &what,
            );
        }
        let none = ["hset", "hmget", "exists", "pexpire", "pttl", "del", "hdel"].map(|c| (c, 0));
        counts(
            &before,
            &committed,
            &none,
            &format!("{name}, layout-1 commands"),
        );

        // Duplicates: answered from the claim's one command (no script, no second trip).
        for key in &keys {
            assert_eq!(
                store.claim(key, &options).await.unwrap(),
                Claim::Completed {
                    processed_at: match store.get(key).await.unwrap().unwrap().state {
                        dedup_core::RecordState::Completed { processed_at, .. } => processed_at,
                        other => panic!("{other:?}"),
                    },
                    outcome: Some(b"done".to_vec())
                },
                "{name}"
            );
        }
        let got = command_calls(&target).await;
        let other = ClaimOptions::lease(Duration::from_secs(30))
            .with_fingerprint(Fingerprint::new("payload-2").unwrap());
        for key in &keys {
            assert!(
                matches!(
                    store.claim(key, &other).await,
                    Err(Error::FingerprintMismatch { .. })
                ),
                "{name}"
            );
        }
        let after = command_calls(&target).await;
        // The get() calls above ran the get script, N of them; the claims ran none.
        let what = format!("{name}, duplicates");
        counts(&committed, &got, &[("evalsha", N), ("set", N)], &what);
        let what = format!("{name}, fingerprint mismatches");
        counts(&got, &after, &[("evalsha", 0), ("set", N)], &what);
    }
}
