//! A foreign value at one of the store's keys (another type, a hash with garbage fields)
//! is a typed error (`Error::Corrupt`), never a panic, and the store leaves it untouched;
//! `purge` skips it. Run against standalone Redis and Redis Cluster.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Raw, Target, config};
use dedup_core::{
    Claim, ClaimOptions, ClaimRequest, DedupStore, Error, Key, Lease, LeaseToken, ManualClock,
    PurgeOptions, Result, Timestamp,
};
use dedup_redis::RedisStore;
use dedup_redis::redis::{self, Value};

fn forged_lease(key: &Key) -> Lease {
    Lease {
        key: key.clone(),
        token: LeaseToken::random(),
        fence: 1,
        attempt: 1,
        expires_at: Timestamp::EPOCH,
    }
}

fn corrupt<T: std::fmt::Debug>(result: Result<T>, what: &str) {
    match result {
        Err(Error::Corrupt { detail, .. }) if !detail.is_empty() => {}
        other => panic!("{what}: expected Error::Corrupt, got {other:?}"),
    }
}

/// Every single-key operation on `key` is `Error::Corrupt`.
async fn every_operation_is_corrupt(store: &RedisStore, key: &Key, what: &str) {
    let lease = forged_lease(key);
    corrupt(
        store.claim(key, &ClaimOptions::default()).await,
        &format!("claim of {what}"),
    );
    corrupt(store.get(key).await, &format!("get of {what}"));
    corrupt(
        store.commit(&lease, Some(b"x")).await,
        &format!("commit of {what}"),
    );
    corrupt(
        store.renew(&lease, Duration::from_secs(1)).await,
        &format!("renew of {what}"),
    );
    corrupt(store.release(&lease).await, &format!("release of {what}"));
}

async fn dump(raw: &mut Raw, redis_key: &str) -> Value {
    raw.run(redis::cmd("DUMP").arg(redis_key)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_type_is_a_typed_error_and_is_left_alone() {
    for target in Target::all("a_foreign_type_is_a_typed_error_and_is_left_alone") {
        let clock = Arc::new(ManualClock::starting_now());
        let store = target.open(config("foreign_type", &clock)).await;
        let mut raw = target.raw().await;
        for kind in ["string", "list", "set", "zset"] {
            let key = Key::new("foreign", kind).unwrap();
            let redis_key = store.redis_key(&key);
            raw.run(&foreign_value(kind, &redis_key)).await;
            let before = dump(&mut raw, &redis_key).await;

            every_operation_is_corrupt(&store, &key, kind).await;

            // In a batch the foreign key is a per-item error; the other items proceed.
            let ok_key = Key::new("foreign", format!("{kind}-neighbour")).unwrap();
            let batch = store
                .claim_many(&[
                    ClaimRequest::new(key.clone(), ClaimOptions::default()),
                    ClaimRequest::new(ok_key.clone(), ClaimOptions::default()),
                ])
                .await
                .expect("claim_many");
            assert!(matches!(batch[0], Err(Error::Corrupt { .. })), "{batch:?}");
            assert!(matches!(batch[1], Ok(Claim::Acquired(_))), "{batch:?}");

            // Purge skips it (even with retention 0 and the clock far ahead).
            clock.advance(Duration::from_secs(3600));
            store
                .purge(&PurgeOptions::older_than(Duration::ZERO))
                .await
                .expect("purge");
            assert_eq!(
                dump(&mut raw, &redis_key).await,
                before,
                "{} {kind}: the foreign value must be left untouched",
                target.name()
            );
        }
    }
}

/// A command writing a value of `kind` (not a hash) at `redis_key`.
fn foreign_value(kind: &str, redis_key: &str) -> redis::Cmd {
    let mut cmd = match kind {
        "string" => redis::cmd("SET"),
        "list" => redis::cmd("RPUSH"),
        "set" => redis::cmd("SADD"),
        _ => redis::cmd("ZADD"),
    };
    cmd.arg(redis_key);
    if kind == "zset" {
        cmd.arg(1);
    }
    cmd.arg("not a record");
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hash_with_garbage_fields_is_a_typed_error() {
    let far = (Timestamp::from_system_time(std::time::SystemTime::now()).as_millis() + 86_400_000)
        .to_string();
    let token = LeaseToken::random().to_string();
    #[rustfmt::skip]
    let garbage: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("no fields we know", vec![("colour", "blue")]),
        ("unknown state", vec![("state", "zz"), ("fence", "1"), ("attempt", "1"), ("retain_until", &far)]),
        ("fence not a number", vec![("state", "i"), ("token", &token), ("fence", "one"), ("attempt", "1"), ("expires_at", &far), ("retain_until", &far)]),
        ("fence zero", vec![("state", "i"), ("token", &token), ("fence", "0"), ("attempt", "1"), ("expires_at", &far), ("retain_until", &far)]),
        ("attempt fractional", vec![("state", "i"), ("token", &token), ("fence", "1"), ("attempt", "1.5"), ("expires_at", &far), ("retain_until", &far)]),
        ("in flight without token", vec![("state", "i"), ("fence", "1"), ("attempt", "1"), ("expires_at", &far), ("retain_until", &far)]),
        ("in flight without expiry", vec![("state", "i"), ("token", &token), ("fence", "1"), ("attempt", "1"), ("retain_until", &far)]),
        ("completed without processed_at", vec![("state", "c"), ("token", &token), ("fence", "1"), ("attempt", "1"), ("retain_until", &far)]),
        ("no retain_until", vec![("state", "c"), ("token", &token), ("fence", "1"), ("attempt", "1"), ("processed_at", "5")]),
    ];
    for target in Target::all("a_hash_with_garbage_fields_is_a_typed_error") {
        let clock = Arc::new(ManualClock::starting_now());
        let store = target.open(config("foreign_hash", &clock)).await;
        let mut raw = target.raw().await;
        for (i, (what, fields)) in garbage.iter().enumerate() {
            let key = Key::new("garbage", format!("h{i}")).unwrap();
            let redis_key = store.redis_key(&key);
            let mut hset = redis::cmd("HSET");
            hset.arg(&redis_key);
            for (f, v) in fields {
                hset.arg(*f).arg(*v);
            }
            raw.run(&hset).await;
            let before = dump(&mut raw, &redis_key).await;
            every_operation_is_corrupt(&store, &key, what).await;
            assert_eq!(
                dump(&mut raw, &redis_key).await,
                before,
                "{} {what}: left untouched",
                target.name()
            );
        }

        // A well-formed hash whose token is not a UUID: `get` cannot turn it into a
        // Record, which is Corrupt too (the scripts themselves treat tokens as opaque).
        let key = Key::new("garbage", "bad-token").unwrap();
        let mut hset = redis::cmd("HSET");
        hset.arg(store.redis_key(&key));
        for (f, v) in [
            ("state", "c"),
            ("token", "not-a-uuid"),
            ("fence", "1"),
            ("attempt", "1"),
            ("processed_at", "5"),
            ("retain_until", far.as_str()),
        ] {
            hset.arg(f).arg(v);
        }
        raw.run(&hset).await;
        corrupt(
            store.get(&key).await,
            "get of a record with a non-UUID token",
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_string_with_a_broken_record_is_a_typed_error() {
    let far = (Timestamp::from_system_time(std::time::SystemTime::now()).as_millis() + 86_400_000)
        .to_string();
    let token = LeaseToken::random().to_string();
    // (what, the value)
    let garbage: Vec<(&str, String)> = vec![
        (
            "another layout version",
            format!("3,c,1,1,5,{far},{token},0,"),
        ),
        ("unknown state", format!("2,z,1,1,5,{far},{token},0,")),
        ("fence zero", format!("2,c,0,1,5,{far},{token},0,")),
        (
            "attempt not a number",
            format!("2,i,1,x,{far},{far},{token},0,"),
        ),
        (
            "in flight without a token",
            format!("2,i,1,1,{far},{far},,0,"),
        ),
        (
            "fingerprint shorter than its length",
            format!("2,c,1,1,5,{far},{token},9,ab"),
        ),
        (
            "bytes after the fingerprint",
            format!("2,i,1,1,{far},{far},{token},2,abjunk"),
        ),
        ("missing fields", "2,c,1,1".to_owned()),
    ];
    for target in Target::all("a_string_with_a_broken_record_is_a_typed_error") {
        let clock = Arc::new(ManualClock::starting_now());
        let store = target.open(config("broken_string", &clock)).await;
        let mut raw = target.raw().await;
        let mut written = Vec::new();
        for (i, (what, value)) in garbage.iter().enumerate() {
            let key = Key::new("broken", format!("s{i}")).unwrap();
            let redis_key = store.redis_key(&key);
            raw.run(redis::cmd("SET").arg(&redis_key).arg(value)).await;
            let before = dump(&mut raw, &redis_key).await;
            every_operation_is_corrupt(&store, &key, what).await;
            let batch = store
                .claim_many(&[ClaimRequest::new(key.clone(), ClaimOptions::default())])
                .await
                .expect("claim_many");
            assert!(
                matches!(batch[0], Err(Error::Corrupt { .. })),
                "{what}: {batch:?}"
            );
            written.push((what, redis_key, before));
        }
        // Purge skips them all (with retention 0 and the clock far ahead).
        clock.advance(Duration::from_secs(3600));
        store
            .purge(&PurgeOptions::older_than(Duration::ZERO))
            .await
            .expect("purge");
        for (what, redis_key, before) in written {
            assert_eq!(
                dump(&mut raw, &redis_key).await,
                before,
                "{} {what}: left untouched",
                target.name()
            );
        }
        // A fast-path lease whose key lost its expiry (PERSIST): its instants are gone. A
        // commit or renew by its holder needs neither and rewrites it; a forged lease's
        // token does not match, so only the operations that read instants report it.
        let key = Key::new("broken", "persisted").unwrap();
        raw.run(
            redis::cmd("SET")
                .arg(store.redis_key(&key))
                .arg(format!("2,l,1,1,1000,1000,{token},0,")),
        )
        .await;
        corrupt(store.get(&key).await, "get of a lease without expiry");
        corrupt(
            store.claim(&key, &ClaimOptions::default()).await,
            "claim of a lease without expiry",
        );
        corrupt(
            store.release(&forged_lease(&key)).await,
            "release of a lease without expiry",
        );

        // A completed record whose token is not a UUID: the claim answers from the value
        // itself and reports it, as `get` does.
        let key = Key::new("broken", "bad-token").unwrap();
        raw.run(
            redis::cmd("SET")
                .arg(store.redis_key(&key))
                .arg(format!("2,c,1,1,5,{far},not-a-uuid,0,")),
        )
        .await;
        corrupt(
            store.get(&key).await,
            "get of a record with a non-UUID token",
        );
        corrupt(
            store.claim(&key, &ClaimOptions::default()).await,
            "claim of a record with a non-UUID token",
        );
    }
}
