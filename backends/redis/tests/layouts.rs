//! The record layouts: layout-1 records (a HASH, as dedup-redis wrote them before the packed
//! string of layout 2) are read, claimed over, committed, renewed, released and purged by
//! this version, which rewrites them as layout 2 (an upgrade in place); and a fresh-key claim
//! (`SET ... NX PX ... GET`, no script) keeps its lease, and a single commit its processed_at,
//! on the server's clock; a released failure's cause makes the record layout 3, which every
//! later write keeps and the client's fast paths leave to the scripts. Standalone and
//! cluster.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{RETENTION, Raw, Target, config, unique_prefix};
use dedup_core::admin::{Admin, Released};
use dedup_core::{
    Claim, ClaimOptions, Clock, DedupStore, Error, Failure, Fingerprint, Key, Lease, LeaseToken,
    ManualClock, PurgeOptions, RecordState, Timestamp,
};
use dedup_redis::redis::{self, Value};
use dedup_redis::{RedisConfig, RedisStore};

const MINUTE: Duration = Duration::from_secs(60);

/// Write `fields` as a layout-1 record (HSET + PEXPIRE, as the old version did).
async fn write_layout_1(raw: &mut Raw, redis_key: &str, fields: &[(&str, String)]) {
    let mut hset = redis::cmd("HSET");
    hset.arg(redis_key);
    for (f, v) in fields {
        hset.arg(*f).arg(v);
    }
    raw.run(&hset).await;
    raw.run(
        redis::cmd("PEXPIRE")
            .arg(redis_key)
            .arg(RETENTION.as_millis() as u64),
    )
    .await;
}

async fn kind(raw: &mut Raw, redis_key: &str) -> String {
    match raw.run(redis::cmd("TYPE").arg(redis_key)).await {
        Value::SimpleString(s) => s,
        other => panic!("TYPE: {other:?}"),
    }
}

async fn value(raw: &mut Raw, redis_key: &str) -> String {
    match raw.run(redis::cmd("GET").arg(redis_key)).await {
        Value::BulkString(b) => String::from_utf8(b).expect("utf-8 record"),
        other => panic!("GET {redis_key}: {other:?}"),
    }
}

/// The key's expiry (`PEXPIRETIME`, ms since the epoch).
async fn expiry(raw: &mut Raw, redis_key: &str) -> i64 {
    match raw.run(redis::cmd("PEXPIRETIME").arg(redis_key)).await {
        Value::Int(at) => at,
        other => panic!("PEXPIRETIME {redis_key}: {other:?}"),
    }
}

/// A store on `target` with the server's clock (no clock injected, so Valkey takes its
/// one-command paths) under a fresh prefix, and a raw connection to read its keys.
async fn on_server_clock(target: &Target, prefix: &str) -> (RedisStore, Raw) {
    let store = target
        .open(RedisConfig {
            prefix: unique_prefix(prefix),
            retention: RETENTION,
            ..RedisConfig::default()
        })
        .await;
    (store, target.raw().await)
}

/// A claim of `key` (a layout-1 lease at fence 3, attempt 2, expired or released) takes it
/// over.
async fn taken_over(store: &RedisStore, key: &Key, name: &str) {
    match store
        .claim(key, &ClaimOptions::lease(MINUTE))
        .await
        .unwrap()
    {
        Claim::Acquired(l) => assert_eq!((l.fence, l.attempt), (4, 3), "{name}"),
        other => panic!("{name}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_1_records_are_read_claimed_over_committed_and_purged() {
    for target in Target::all("layout_1_records_are_read_claimed_over_committed_and_purged") {
        let clock = Arc::new(ManualClock::starting_now());
        let store = target.open(config("layout1", &clock)).await;
        let mut raw = target.raw().await;
        let now = clock.now().as_millis();
        let until = (now + RETENTION.as_millis() as i64).to_string();
        let ms = |offset: i64| (now + offset).to_string();
        let in_flight = |token: &LeaseToken, expires_at: String| {
            vec![
                ("state", "i".to_owned()),
                ("token", token.to_string()),
                ("fence", "3".to_owned()),
                ("attempt", "2".to_owned()),
                ("expires_at", expires_at),
                ("retain_until", until.clone()),
            ]
        };
        let lease = |key: &Key, token: LeaseToken| Lease {
            key: key.clone(),
            token,
            fence: 3,
            attempt: 2,
            expires_at: Timestamp::from_millis(now + 60_000),
        };
        let name = &target.name();

        // A completed record, with an outcome and a fingerprint: a duplicate gets it.
        let done = Key::new("layout1", "completed").unwrap();
        let done_key = store.redis_key(&done);
        let committer = LeaseToken::random();
        write_layout_1(
            &mut raw,
            &done_key,
            &[
                ("state", "c".to_owned()),
                ("token", committer.to_string()),
                ("fence", "2".to_owned()),
                ("attempt", "1".to_owned()),
                ("processed_at", ms(-1_000)),
                ("outcome", "old outcome".to_owned()),
                ("fingerprint", "fp-1".to_owned()),
                ("retain_until", until.clone()),
            ],
        )
        .await;
        let with =
            |fp: &str| ClaimOptions::lease(MINUTE).with_fingerprint(Fingerprint::new(fp).unwrap());
        assert_eq!(
            store.claim(&done, &with("fp-1")).await.unwrap(),
            Claim::Completed {
                processed_at: Timestamp::from_millis(now - 1_000),
                outcome: Some(b"old outcome".to_vec()),
            },
            "{name}"
        );
        assert!(
            matches!(
                store.claim(&done, &with("fp-2")).await,
                Err(Error::FingerprintMismatch { .. })
            ),
            "{name}"
        );
        let record = store
            .get(&done)
            .await
            .unwrap()
            .expect("the completed record");
        assert_eq!((record.fence, record.attempt), (2, 1), "{name}");
        assert_eq!(record.fingerprint.unwrap().as_str(), "fp-1");
        assert_eq!(
            kind(&mut raw, &done_key).await,
            "hash",
            "{name}: reads write nothing"
        );

        // A live lease: InFlight for others; its holder commits it (rewritten as layout 2).
        let live = Key::new("layout1", "live").unwrap();
        let live_key = store.redis_key(&live);
        let holder = LeaseToken::random();
        write_layout_1(&mut raw, &live_key, &in_flight(&holder, ms(60_000))).await;
        assert_eq!(
            store
                .claim(&live, &ClaimOptions::lease(MINUTE))
                .await
                .unwrap(),
            Claim::InFlight {
                expires_at: Timestamp::from_millis(now + 60_000),
                attempt: 2
            },
            "{name}"
        );
        let renewed = store.renew(&lease(&live, holder), MINUTE).await.unwrap();
        assert_eq!((renewed.fence, renewed.attempt), (3, 2), "{name}");
        assert_eq!(
            kind(&mut raw, &live_key).await,
            "string",
            "{name}: renew rewrites"
        );
        store
            .commit(&lease(&live, holder), Some(b"new"))
            .await
            .unwrap();
        let v = value(&mut raw, &live_key).await;
        assert!(
            v.starts_with("2,c,3,2,") && v.ends_with(",new"),
            "{name}: {v}"
        );
        match store.get(&live).await.unwrap().unwrap().state {
            RecordState::Completed { outcome, token, .. } => {
                assert_eq!(outcome.as_deref(), Some(&b"new"[..]));
                assert_eq!(token, Some(holder));
            }
            other => panic!("{name}: {other:?}"),
        }

        // An expired lease: taken over (fence and attempt + 1), written as layout 2.
        let expired = Key::new("layout1", "expired").unwrap();
        let expired_key = store.redis_key(&expired);
        write_layout_1(
            &mut raw,
            &expired_key,
            &in_flight(&LeaseToken::random(), ms(-5)),
        )
        .await;
        taken_over(&store, &expired, name).await;
        assert_eq!(kind(&mut raw, &expired_key).await, "string", "{name}");

        // A release of a layout-1 lease: the key can be taken over at once.
        let released = Key::new("layout1", "released").unwrap();
        let released_key = store.redis_key(&released);
        let token = LeaseToken::random();
        write_layout_1(&mut raw, &released_key, &in_flight(&token, ms(60_000))).await;
        store.release(&lease(&released, token)).await.unwrap();
        taken_over(&store, &released, name).await;

        // Purge removes layout-1 records by the same rules (the completed one, an expired
        // lease), never a live one.
        let old_lease = Key::new("layout1", "old-lease").unwrap();
        let old_live = Key::new("layout1", "old-live").unwrap();
        write_layout_1(
            &mut raw,
            &store.redis_key(&old_lease),
            &in_flight(&LeaseToken::random(), ms(-2_000)),
        )
        .await;
        write_layout_1(
            &mut raw,
            &store.redis_key(&old_live),
            &in_flight(&LeaseToken::random(), ms(3_600_000)),
        )
        .await;
        let report = store
            .purge(&PurgeOptions::older_than(Duration::from_millis(500)))
            .await
            .unwrap();
        assert_eq!(
            (report.completed, report.expired),
            (1, 1),
            "{name}: {report:?}"
        );
        assert!(store.get(&done).await.unwrap().is_none(), "{name}");
        assert!(store.get(&old_lease).await.unwrap().is_none(), "{name}");
        assert!(store.get(&old_live).await.unwrap().is_some(), "{name}");
    }
}

/// A fresh-key claim on the server's clock writes lengths, not instants: the server's
/// expiry of the key holds them, and the lease ends by the server's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_path_lease_expires_on_the_server_clock() {
    for target in Target::all("a_fast_path_lease_expires_on_the_server_clock") {
        let (store, mut raw) = on_server_clock(&target, "fast_lease").await;
        let name = &target.name();
        let key = Key::new("fast", "lease").unwrap();
        let redis_key = store.redis_key(&key);
        let options = ClaimOptions::lease(Duration::from_millis(400));
        let Claim::Acquired(lease) = store.claim(&key, &options).await.unwrap() else {
            panic!("{name}: a fresh key is acquired");
        };
        assert_eq!((lease.fence, lease.attempt), (1, 1));
        let stored = value(&mut raw, &redis_key).await;
        assert!(
            stored.starts_with(&format!(
                "2,l,1,1,400,{},{},0,",
                RETENTION.as_millis(),
                RedisStore::stored_token(lease.token)
            )),
            "{name}: {stored}"
        );
        // The lease's expiry is the server's: what the key's expiry says, exactly.
        let at = expiry(&mut raw, &redis_key).await;
        let retention_ms = RETENTION.as_millis() as i64;
        assert_eq!(lease.expires_at.as_millis(), at - retention_ms, "{name}");
        assert_eq!(
            store.claim(&key, &options).await.unwrap(),
            Claim::InFlight {
                expires_at: lease.expires_at,
                attempt: 1
            },
            "{name}"
        );
        match store.get(&key).await.unwrap().unwrap().state {
            RecordState::InFlight { expires_at, token } => {
                assert_eq!(
                    (expires_at, token),
                    (lease.expires_at, lease.token),
                    "{name}"
                )
            }
            other => panic!("{name}: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        match store.claim(&key, &options).await.unwrap() {
            Claim::Acquired(l) => assert_eq!((l.fence, l.attempt), (2, 2), "{name}"),
            other => panic!("{name}: after the lease: {other:?}"),
        }
        assert!(
            matches!(
                store.commit(&lease, None).await,
                Err(Error::LeaseLost { .. })
            ),
            "{name}: the first holder lost the key"
        );
    }
}

/// A single commit on the server's clock reads no clock: it writes the retention, and the
/// key's expiry (set by the server) holds processed_at + retention. Every reader takes
/// processed_at from there: a duplicate's claim (the fast path, no script), `get`, the
/// purge; a commit again with the same lease is still Ok, and the other lease operations
/// on the completed record lose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_path_commit_keeps_its_instants_in_the_keys_expiry() {
    for target in Target::all("a_fast_path_commit_keeps_its_instants_in_the_keys_expiry") {
        let (store, mut raw) = on_server_clock(&target, "fast_commit").await;
        let name = &target.name();
        let key = Key::new("fast", "commit").unwrap();
        let redis_key = store.redis_key(&key);
        let fingerprint = Fingerprint::new("f,p").unwrap();
        let options = ClaimOptions::lease(MINUTE).with_fingerprint(fingerprint.clone());
        let Claim::Acquired(lease) = store.claim(&key, &options).await.unwrap() else {
            panic!("{name}: a fresh key is acquired");
        };
        store.commit(&lease, Some(b"out,come")).await.unwrap();
        let retention_ms = RETENTION.as_millis() as i64;
        assert_eq!(
            value(&mut raw, &redis_key).await,
            format!(
                "2,d,1,1,0,{retention_ms},{},3,f,p,out,come",
                RedisStore::stored_token(lease.token)
            ),
            "{name}"
        );
        let at = expiry(&mut raw, &redis_key).await;
        let processed_at = Timestamp::from_millis(at - retention_ms);
        let claimed_at = lease.expires_at.as_millis() - MINUTE.as_millis() as i64;
        assert!(
            (claimed_at..claimed_at + 60_000).contains(&processed_at.as_millis()),
            "{name}: processed at {processed_at:?}, claimed at {claimed_at}"
        );
        let done = Claim::Completed {
            processed_at,
            outcome: Some(b"out,come".to_vec()),
        };
        // Answered by the fast path (tests/round_trips.rs counts that it runs no script).
        assert_eq!(store.claim(&key, &options).await.unwrap(), done, "{name}");
        let other = ClaimOptions::lease(MINUTE).with_fingerprint(Fingerprint::new("g").unwrap());
        assert!(
            matches!(
                store.claim(&key, &other).await,
                Err(Error::FingerprintMismatch { .. })
            ),
            "{name}"
        );
        match store.get(&key).await.unwrap().unwrap().state {
            RecordState::Completed {
                processed_at: p,
                outcome,
                token,
            } => {
                assert_eq!(p, processed_at, "{name}");
                assert_eq!(outcome.as_deref(), Some(&b"out,come"[..]), "{name}");
                assert_eq!(token, Some(lease.token), "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
        store
            .commit(&lease, Some(b"out,come"))
            .await
            .expect("a commit again with the same lease");
        let forged = Lease {
            token: LeaseToken::random(),
            ..lease.clone()
        };
        assert!(
            matches!(
                store.commit(&forged, None).await,
                Err(Error::LeaseLost { .. })
            ),
            "{name}"
        );
        assert!(
            matches!(
                store.renew(&lease, MINUTE).await,
                Err(Error::LeaseLost { .. })
            ),
            "{name}"
        );
        assert!(
            matches!(store.release(&lease).await, Err(Error::LeaseLost { .. })),
            "{name}"
        );
        assert_eq!(
            value(&mut raw, &redis_key).await,
            format!(
                "2,d,1,1,0,{retention_ms},{},3,f,p,out,come",
                RedisStore::stored_token(lease.token)
            ),
            "{name}: unchanged by all of that"
        );
        // The purge reads processed_at from the key's expiry too: kept while younger than
        // the purge's retention, removed once older.
        let kept = store
            .purge(&PurgeOptions::older_than(Duration::from_secs(3600)))
            .await
            .unwrap();
        assert_eq!(kept.completed, 0, "{name}: {kept:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
        let removed = store
            .purge(&PurgeOptions::older_than(Duration::from_millis(1)))
            .await
            .unwrap();
        assert_eq!(removed.completed, 1, "{name}: {removed:?}");
        assert!(store.get(&key).await.unwrap().is_none(), "{name}");
    }
}

/// A failure whose chain holds the layout's separators and a NUL.
fn failure(attempt: u32) -> Failure {
    Failure::new(
        "handler",
        vec!["invalid JSON, at 1:2".into(), "root\0cause, ünïcödé".into()],
        attempt,
        Timestamp::from_millis(1_700_000_000_123),
        Some("worker,1"),
    )
}

/// `value` with its failure part, if it is a layout-3 record holding `f`.
fn holds(value: &str, f: &Failure) -> bool {
    let encoded = String::from_utf8(f.encode()).expect("utf-8 failure");
    value.starts_with("3,") && value.contains(&format!(",3,f,p,{},{encoded}", encoded.len()))
}

/// On the server's clock, so that Valkey takes its one-command paths: a record written
/// before (layout 2, by a fresh-key claim) keeps no cause; `release_failed` writes layout 3
/// with the cause, and the lease's next commit (which its remembered value no longer
/// matches, and `lua/commit_fast.lua` leaves to the full script) keeps it with the outcome.
/// A duplicate's `SET ... GET` hands the layout-3 record to the claim script, which answers
/// `Completed` (and `FingerprintMismatch`) as for layout 2. On a second key the cause stays
/// through a takeover, a renewal, an operator's release and a plain release, and the next
/// `release_failed` replaces it. A layout-3 value with a cut or unreadable cause is
/// `Corrupt`, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_failure_makes_layout_3_and_every_write_keeps_it() {
    for target in Target::all("a_released_failure_makes_layout_3_and_every_write_keeps_it") {
        let (store, mut raw) = on_server_clock(&target, "layout3").await;
        let name = &target.name();
        let options =
            ClaimOptions::lease(MINUTE).with_fingerprint(Fingerprint::new("f,p").unwrap());
        let acquire = |key: Key| {
            let (store, options) = (&store, &options);
            async move {
                match store.claim(&key, options).await.unwrap() {
                    Claim::Acquired(lease) => lease,
                    other => panic!("{key}: {other:?}"),
                }
            }
        };

        let key = Key::new("failing", "poison-1").unwrap();
        let redis_key = store.redis_key(&key);
        let lease = acquire(key.clone()).await;
        let lease = store.renew(&lease, MINUTE).await.unwrap();
        assert!(
            value(&mut raw, &redis_key).await.starts_with("2,"),
            "{name}"
        );
        assert_eq!(store.get(&key).await.unwrap().unwrap().last_failure, None);
        let f1 = failure(1);
        store.release_failed(&lease, &f1).await.unwrap();
        let released = value(&mut raw, &redis_key).await;
        assert!(
            holds(&released, &f1) && released.starts_with("3,i,1,1,"),
            "{name}: {released:?}"
        );
        let record = store.get(&key).await.unwrap().unwrap();
        assert_eq!(record.last_failure.as_ref(), Some(&f1), "{name}");
        assert!(
            matches!(record.state, RecordState::InFlight { token, .. } if token == lease.token),
            "{name}: {record:?}"
        );
        store.commit(&lease, Some(b"out,come")).await.unwrap();
        let committed = value(&mut raw, &redis_key).await;
        assert!(
            holds(&committed, &f1)
                && committed.starts_with("3,c,1,1,")
                && committed.ends_with(",out,come"),
            "{name}: {committed:?}"
        );
        let record = store.get(&key).await.unwrap().unwrap();
        assert_eq!(record.last_failure.as_ref(), Some(&f1), "{name}");
        let RecordState::Completed { processed_at, .. } = record.state else {
            panic!("{name}: {record:?}");
        };
        assert_eq!(
            store.claim(&key, &options).await.unwrap(),
            Claim::Completed {
                processed_at,
                outcome: Some(b"out,come".to_vec())
            },
            "{name}"
        );
        let other = ClaimOptions::lease(MINUTE).with_fingerprint(Fingerprint::new("g").unwrap());
        assert!(
            matches!(
                store.claim(&key, &other).await,
                Err(Error::FingerprintMismatch { .. })
            ),
            "{name}"
        );
        assert_eq!(value(&mut raw, &redis_key).await, committed, "{name}");

        let key = Key::new("failing", "poison-2").unwrap();
        let redis_key = store.redis_key(&key);
        let first = acquire(key.clone()).await;
        store.release_failed(&first, &f1).await.unwrap();
        let second = acquire(key.clone()).await;
        assert_eq!((second.fence, second.attempt), (2, 2), "{name}");
        let second = store.renew(&second, MINUTE).await.unwrap();
        assert!(holds(&value(&mut raw, &redis_key).await, &f1), "{name}");
        assert_eq!(
            store.release_key(&key, true).await.unwrap(),
            Released::Released {
                fence: 2,
                attempt: 2,
                was_live: true
            },
            "{name}"
        );
        assert!(holds(&value(&mut raw, &redis_key).await, &f1), "{name}");
        let third = acquire(key.clone()).await;
        store.release(&third).await.unwrap();
        assert!(holds(&value(&mut raw, &redis_key).await, &f1), "{name}");
        assert!(
            matches!(
                store.release_failed(&second, &failure(2)).await,
                Err(Error::LeaseLost { .. })
            ),
            "{name}: the revoked lease"
        );
        let fourth = acquire(key.clone()).await;
        let f4 = failure(4);
        store.release_failed(&fourth, &f4).await.unwrap();
        let v = value(&mut raw, &redis_key).await;
        assert!(holds(&v, &f4) && !holds(&v, &f1), "{name}: {v:?}");
        assert_eq!(
            store.get(&key).await.unwrap().unwrap().last_failure,
            Some(f4),
            "{name}"
        );

        let token = LeaseToken::random();
        // The scripts check the layout; the cause's own encoding is checked where it is
        // read (`get`, `list`), so only the first two make a claim fail too.
        for (id, bad, claim_fails) in [
            (
                "cut",
                format!("3,c,1,1,5,99999999999999,{token},0,,40,1short"),
                true,
            ),
            (
                "no-length",
                format!("3,c,1,1,5,99999999999999,{token},0,"),
                true,
            ),
            (
                "unreadable",
                format!("3,c,1,1,5,99999999999999,{token},0,,5,xxxxx"),
                false,
            ),
        ] {
            let key = Key::new("failing", id).unwrap();
            let redis_key = store.redis_key(&key);
            raw.run(redis::cmd("SET").arg(&redis_key).arg(&bad)).await;
            assert!(
                matches!(store.get(&key).await, Err(Error::Corrupt { .. })),
                "{name}: {id}"
            );
            let claim = store.claim(&key, &options).await;
            assert_eq!(
                matches!(claim, Err(Error::Corrupt { .. })),
                claim_fails,
                "{name}: {id}: {claim:?}"
            );
            assert_eq!(value(&mut raw, &redis_key).await, bad, "{name}: {id}");
        }
    }
}

/// Records written before tokens were kept in Z85 hold the lease token as UUID text. A lease
/// on such a record (handed out by the earlier version) is still its holder's here: renew,
/// commit, a commit again, release and an operator's release all match it
/// (`lua/record.lua`'s `same_token`); `get` reads the token; and a commit writes the
/// committing token in Z85 from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_records_with_the_uuid_text_of_earlier_versions_hold() {
    for target in Target::all("leases_on_records_with_the_uuid_text_of_earlier_versions_hold") {
        let (store, mut raw) = on_server_clock(&target, "uuid_text").await;
        let name = &target.name();
        let retention_ms = RETENTION.as_millis() as i64;
        let lease_ms = MINUTE.as_millis() as i64;
        // As an earlier version's fresh-key claim wrote it: `l`, the UUID text.
        let earlier = async |raw: &mut Raw, id: &str| -> Lease {
            let key = Key::new("uuid-text", id).unwrap();
            let token = LeaseToken::random();
            raw.run(
                redis::cmd("SET")
                    .arg(store.redis_key(&key))
                    .arg(format!("2,l,1,1,{lease_ms},{retention_ms},{token},0,"))
                    .arg("PX")
                    .arg(lease_ms + retention_ms),
            )
            .await;
            Lease {
                key,
                token,
                fence: 1,
                attempt: 1,
                expires_at: Timestamp::from_millis(0),
            }
        };

        let lease = earlier(&mut raw, "committed").await;
        match store.get(&lease.key).await.unwrap().unwrap().state {
            RecordState::InFlight { token, .. } => assert_eq!(token, lease.token, "{name}"),
            other => panic!("{name}: {other:?}"),
        }
        let lease = store.renew(&lease, MINUTE).await.unwrap();
        store.commit(&lease, Some(b"done")).await.unwrap();
        store.commit(&lease, Some(b"again")).await.unwrap();
        let stored = value(&mut raw, &store.redis_key(&lease.key)).await;
        assert!(
            stored.contains(&format!(
                ",{},0,,done",
                RedisStore::stored_token(lease.token)
            )),
            "{name}: {stored}"
        );
        match store.get(&lease.key).await.unwrap().unwrap().state {
            RecordState::Completed { token, outcome, .. } => {
                assert_eq!(
                    (token, outcome.as_deref()),
                    (Some(lease.token), Some(&b"done"[..])),
                    "{name}"
                )
            }
            other => panic!("{name}: {other:?}"),
        }

        let lease = earlier(&mut raw, "released").await;
        store.release(&lease).await.unwrap();
        match store
            .claim(&lease.key, &ClaimOptions::lease(MINUTE))
            .await
            .unwrap()
        {
            Claim::Acquired(l) => assert_eq!((l.fence, l.attempt), (2, 2), "{name}"),
            other => panic!("{name}: after the release: {other:?}"),
        }

        let lease = earlier(&mut raw, "revoked").await;
        assert_eq!(
            store.release_key(&lease.key, true).await.unwrap(),
            Released::Released {
                fence: 1,
                attempt: 1,
                was_live: true
            },
            "{name}"
        );
        assert!(
            matches!(
                store.commit(&lease, None).await,
                Err(Error::LeaseLost { .. })
            ),
            "{name}: the revoked lease"
        );
    }
}
