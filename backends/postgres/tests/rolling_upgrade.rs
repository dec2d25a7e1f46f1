//! A rolling upgrade: a process of the previous version and one of this version share a
//! table. Each answers the other's records, takes over the other's expired leases, and a
//! key claimed by both at once is acquired by one of them only.
//!
//! The previous version is the one before a fresh claim left `first_claimed_at` NULL
//! (schema version 5, commit 21bd10e): its claim, takeover, commit and read are kept here
//! frozen, as it ran them, with its decoding (the shared `RawRecord`, the column as
//! stored).

mod common;

use std::sync::Arc;
use std::time::Duration;

use dedup_core::backend::{RawRecord, RawState};
use dedup_core::{Claim, ClaimOptions, Clock, DedupStore, Key, ManualClock, Record, RecordState};
use dedup_postgres::PostgresStore;
use dedup_postgres::sqlx::{self, AssertSqlSafe, Row, postgres::PgRow};

/// "Now" as the previous version computed it: the bound clock `$1`, else the server's.
const NOW_MS: &str =
    "coalesce($1::bigint, floor(date_part('epoch', clock_timestamp()) * 1000 + 0.0005)::bigint)";

/// The previous version's record columns, `first_claimed_at` as stored.
fn old_cols(alias: &str) -> String {
    [
        "consumer",
        "message_id",
        "token",
        "fence",
        "attempt",
        "expires_at",
        "processed_at",
        "outcome",
        "fingerprint",
        "first_claimed_at",
        "last_failure",
    ]
    .iter()
    .map(|c| match *c {
        "token" => format!("{alias}token::text AS token"),
        _ => format!("{alias}{c} AS {c}"),
    })
    .collect::<Vec<_>>()
    .join(", ")
}

/// What the previous version's claim answered, as far as this test needs.
#[derive(Debug, PartialEq)]
enum OldClaim {
    Acquired { token: String, fence: i64 },
    InFlight,
    Completed(Option<Vec<u8>>),
}

/// A process of the previous version on the store's table, on the store's clock.
struct Old {
    pool: sqlx::PgPool,
    table: String,
    clock: Arc<ManualClock>,
}

impl Old {
    fn now(&self) -> i64 {
        self.clock.now().as_millis()
    }

    /// The previous version's `claim_fresh`: the insert of a fresh lease, nothing on a
    /// conflict.
    async fn claim_fresh(&self, key: &Key, token: &str, lease_ms: i64) -> Option<i64> {
        let sql = format!(
            "INSERT INTO {table} (consumer, message_id, token, fence, attempt, claimed_at, expires_at, fingerprint, first_claimed_at) \
               SELECT $2, $3, $4::uuid, 1, 1, now.ms, now.ms + $5::bigint, $6::text, now.ms FROM (SELECT {NOW_MS} AS ms) now \
               ON CONFLICT (consumer, message_id) DO NOTHING RETURNING expires_at",
            table = self.table
        );
        sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(self.now())
            .bind(key.consumer())
            .bind(key.message_id())
            .bind(token)
            .bind(lease_ms)
            .bind(None::<String>)
            .fetch_optional(&self.pool)
            .await
            .expect("old claim_fresh")
    }

    /// The previous version's `claim`: insert, or take an expired lease over.
    async fn claim_takeover(&self, key: &Key, token: &str, lease_ms: i64) -> Option<PgRow> {
        let sql = format!(
            "INSERT INTO {table} AS r (consumer, message_id, token, fence, attempt, claimed_at, expires_at, fingerprint, first_claimed_at) \
               SELECT $2, $3, $4::uuid, 1, 1, now.ms, now.ms + $5::bigint, $6::text, now.ms FROM (SELECT {NOW_MS} AS ms) now \
               ON CONFLICT (consumer, message_id) DO UPDATE SET \
                 token = excluded.token, fence = r.fence + 1, attempt = r.attempt + 1, \
                 claimed_at = excluded.claimed_at, expires_at = excluded.expires_at, \
                 fingerprint = coalesce(excluded.fingerprint, r.fingerprint) \
               WHERE r.processed_at IS NULL \
                 AND r.expires_at <= excluded.claimed_at \
                 AND (excluded.fingerprint IS NULL OR r.fingerprint IS NULL \
                      OR r.fingerprint = excluded.fingerprint) \
               RETURNING true AS wrote, r.claimed_at AS now_ms, {cols}",
            table = self.table,
            cols = old_cols("r.")
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(self.now())
            .bind(key.consumer())
            .bind(key.message_id())
            .bind(token)
            .bind(lease_ms)
            .bind(None::<String>)
            .fetch_optional(&self.pool)
            .await
            .expect("old claim")
    }

    /// The previous version's `read_one`, decoded as it decoded it.
    async fn get(&self, key: &Key) -> Option<Record> {
        let sql = format!(
            "SELECT false AS wrote, now.ms AS now_ms, {cols} FROM (SELECT {NOW_MS} AS ms) now \
             CROSS JOIN {table} t WHERE t.consumer = $2 AND t.message_id = $3",
            table = self.table,
            cols = old_cols("t.")
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(self.now())
            .bind(key.consumer())
            .bind(key.message_id())
            .fetch_optional(&self.pool)
            .await
            .expect("old read")?;
        Some(old_decode(&row, key))
    }

    /// The previous version's claim of one key: the fresh insert; else the stored record
    /// read and the contract applied, an expired lease taken over.
    async fn claim(&self, key: &Key, lease: Duration) -> OldClaim {
        let lease_ms = i64::try_from(lease.as_millis()).unwrap();
        let token = uuid::Uuid::new_v4().to_string();
        if self.claim_fresh(key, &token, lease_ms).await.is_some() {
            return OldClaim::Acquired { token, fence: 1 };
        }
        let record = self.get(key).await.expect("a record after a conflict");
        match record.state {
            RecordState::Completed { outcome, .. } => OldClaim::Completed(outcome),
            RecordState::InFlight { expires_at, .. } if expires_at.as_millis() > self.now() => {
                OldClaim::InFlight
            }
            RecordState::InFlight { .. } => {
                match self.claim_takeover(key, &token, lease_ms).await {
                    Some(row) => OldClaim::Acquired {
                        token,
                        fence: i64::try_from(old_decode(&row, key).fence).unwrap(),
                    },
                    // Taken over (or completed) by someone else first: answered from the
                    // record as it is now.
                    None => match self.get(key).await.expect("the record").state {
                        RecordState::Completed { outcome, .. } => OldClaim::Completed(outcome),
                        RecordState::InFlight { .. } => OldClaim::InFlight,
                    },
                }
            }
        }
    }

    /// The previous version's `commit_held`: whether the token still held the lease.
    async fn commit(&self, key: &Key, token: &str, outcome: Option<&[u8]>) -> bool {
        let sql = format!(
            "UPDATE {table} AS r SET processed_at = {NOW_MS}, expires_at = NULL, outcome = $5::bytea \
             WHERE r.consumer = $2 AND r.message_id = $3 AND r.token = $4::uuid \
               AND r.processed_at IS NULL",
            table = self.table
        );
        let done = sqlx::query(AssertSqlSafe(sql))
            .bind(self.now())
            .bind(key.consumer())
            .bind(key.message_id())
            .bind(token)
            .bind(outcome)
            .execute(&self.pool)
            .await
            .expect("old commit");
        done.rows_affected() == 1
    }
}

/// The previous version's decoding of a record row.
fn old_decode(row: &PgRow, key: &Key) -> Record {
    let processed_at: Option<i64> = row.get("processed_at");
    RawRecord {
        state: match processed_at {
            Some(_) => RawState::Completed,
            None => RawState::InFlight,
        },
        token: row.get("token"),
        fence: row.get("fence"),
        attempt: row.get::<i32, _>("attempt").into(),
        expires_at: row.get("expires_at"),
        processed_at,
        outcome: row.get("outcome"),
        fingerprint: row.get("fingerprint"),
        first_claimed_at: row.get("first_claimed_at"),
        last_failure: row.get::<Option<&[u8]>, _>("last_failure"),
    }
    .decode(key)
    .expect("the previous version decodes the record")
}

/// A store of this version and a process of the previous one on one fresh table, on one
/// manual clock.
async fn both(url: &str, test: &str) -> (PostgresStore, Old, Arc<ManualClock>) {
    let clock = common::manual_clock();
    let store = common::store(url, test, Some(clock.clone())).await;
    let old = Old {
        pool: store.pool().clone(),
        table: format!("\"{}\".\"{}\"", common::SCHEMA, store.config().table),
        clock: clock.clone(),
    };
    (store, old, clock)
}

const LEASE: Duration = Duration::from_secs(1);

fn key(id: &str) -> Key {
    Key::new("billing", id).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_version_answers_the_others_records() {
    let url = url_or_skip!();
    let (new, old, clock) = both(&url, "rolling_answers").await;
    let claimed_at = clock.now();

    // Written by this version, answered by the previous one.
    let k = key("new-written");
    let Claim::Acquired(lease) = new.claim(&k, &ClaimOptions::lease(LEASE)).await.unwrap() else {
        panic!("fresh key")
    };
    assert_eq!(old.claim(&k, LEASE).await, OldClaim::InFlight);
    let seen = old.get(&k).await.expect("the record");
    assert_eq!((seen.fence, seen.attempt), (1, 1));
    assert_eq!(
        seen.first_claimed_at, None,
        "the previous version shows a claimed-once record's first claim as not known"
    );
    assert!(
        !old.commit(&k, &uuid::Uuid::new_v4().to_string(), None)
            .await,
        "another token commits nothing"
    );
    new.commit(&lease, Some(b"new")).await.unwrap();
    assert_eq!(
        old.claim(&k, LEASE).await,
        OldClaim::Completed(Some(b"new".to_vec()))
    );
    let seen = old.get(&k).await.unwrap();
    assert!(
        matches!(&seen.state, RecordState::Completed { token: Some(t), .. } if *t == lease.token),
        "the committing token is kept: {seen:?}"
    );
    assert_eq!(
        new.get(&k).await.unwrap().unwrap().first_claimed_at,
        Some(claimed_at),
        "this version reads a claimed-once record's first claim from claimed_at"
    );

    // Written by the previous version, answered by this one.
    let k = key("old-written");
    let OldClaim::Acquired { token, fence: 1 } = old.claim(&k, LEASE).await else {
        panic!("fresh key")
    };
    let claim = new.claim(&k, &ClaimOptions::lease(LEASE)).await.unwrap();
    assert!(
        matches!(claim, Claim::InFlight { attempt: 1, .. }),
        "{claim:?}"
    );
    assert!(old.commit(&k, &token, Some(b"old")).await);
    let claim = new.claim(&k, &ClaimOptions::lease(LEASE)).await.unwrap();
    assert!(
        matches!(&claim, Claim::Completed { outcome: Some(o), .. } if o == b"old"),
        "{claim:?}"
    );
    let record = new.get(&k).await.unwrap().unwrap();
    assert_eq!(record.first_claimed_at, Some(claimed_at));
    assert!(
        matches!(&record.state, RecordState::Completed { token: Some(t), .. } if t.to_string() == token),
        "{record:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_version_takes_over_the_others_expired_leases() {
    let url = url_or_skip!();
    let (new, old, clock) = both(&url, "rolling_takeovers").await;
    let first = clock.now();

    // This version's lease, taken over by the previous version. The previous version does
    // not carry the first claim over, so it is not known any more, and never shown as the
    // takeover's time.
    let k = key("new-then-old");
    assert!(
        new.claim(&k, &ClaimOptions::lease(LEASE))
            .await
            .unwrap()
            .is_acquired()
    );
    clock.advance(2 * LEASE);
    let OldClaim::Acquired { token, fence: 2 } = old.claim(&k, LEASE).await else {
        panic!("the previous version takes the expired lease over")
    };
    let record = new.get(&k).await.unwrap().unwrap();
    assert_eq!((record.fence, record.attempt), (2, 2));
    assert_eq!(record.first_claimed_at, None, "{record:?}");
    let claim = new.claim(&k, &ClaimOptions::lease(LEASE)).await.unwrap();
    assert!(
        matches!(claim, Claim::InFlight { attempt: 2, .. }),
        "{claim:?}"
    );
    assert!(old.commit(&k, &token, Some(b"old")).await);
    let claim = new.claim(&k, &ClaimOptions::lease(LEASE)).await.unwrap();
    assert!(
        matches!(&claim, Claim::Completed { outcome: Some(o), .. } if o == b"old"),
        "{claim:?}"
    );

    // The previous version's lease, taken over by this version: the first claim is kept.
    clock.set(first);
    let k = key("old-then-new");
    let OldClaim::Acquired { token, .. } = old.claim(&k, LEASE).await else {
        panic!("fresh key")
    };
    clock.advance(2 * LEASE);
    let Claim::Acquired(lease) = new.claim(&k, &ClaimOptions::lease(LEASE)).await.unwrap() else {
        panic!("this version takes the expired lease over")
    };
    assert_eq!((lease.fence, lease.attempt), (2, 2));
    assert!(
        !old.commit(&k, &token, None).await,
        "the lease taken over is lost"
    );
    assert_eq!(
        new.get(&k).await.unwrap().unwrap().first_claimed_at,
        Some(first)
    );
    assert_eq!(old.get(&k).await.unwrap().first_claimed_at, Some(first));
    new.commit(&lease, None).await.unwrap();
    assert_eq!(old.claim(&k, LEASE).await, OldClaim::Completed(None));

    // This version's own takeover of a claimed-once record writes the first claim down,
    // where the previous version reads it too.
    clock.set(first);
    let k = key("new-then-new");
    assert!(
        new.claim(&k, &ClaimOptions::lease(LEASE))
            .await
            .unwrap()
            .is_acquired()
    );
    clock.advance(2 * LEASE);
    let Claim::Acquired(lease) = new.claim(&k, &ClaimOptions::lease(LEASE)).await.unwrap() else {
        panic!("takeover")
    };
    assert_eq!(lease.fence, 2);
    assert_eq!(
        new.get(&k).await.unwrap().unwrap().first_claimed_at,
        Some(first)
    );
    assert_eq!(old.get(&k).await.unwrap().first_claimed_at, Some(first));
    assert_eq!(old.claim(&k, LEASE).await, OldClaim::InFlight);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_claimed_by_both_versions_at_once_is_acquired_once() {
    let url = url_or_skip!();
    let (new, old, clock) = both(&url, "rolling_duplicates").await;
    let mut won = (0, 0);
    for i in 0..40 {
        let k = key(&format!("both-{i}"));
        let options = ClaimOptions::lease(LEASE);
        let (mine, theirs) = tokio::join!(new.claim(&k, &options), old.claim(&k, LEASE));
        let mine = mine.unwrap();
        match (&mine, &theirs) {
            (Claim::Acquired(lease), OldClaim::InFlight) => {
                won.0 += 1;
                new.commit(lease, Some(b"new")).await.unwrap();
                assert_eq!(
                    old.claim(&k, LEASE).await,
                    OldClaim::Completed(Some(b"new".to_vec()))
                );
            }
            (Claim::InFlight { .. }, OldClaim::Acquired { token, .. }) => {
                won.1 += 1;
                assert!(old.commit(&k, token, Some(b"old")).await);
                let claim = new.claim(&k, &options).await.unwrap();
                assert!(
                    matches!(&claim, Claim::Completed { outcome: Some(o), .. } if o == b"old"),
                    "{claim:?}"
                );
            }
            _ => panic!("exactly one acquires {k:?}: {mine:?} / {theirs:?}"),
        }
        // Expired and claimed by both again: one takes it over, fence 2.
        let k = key(&format!("expired-{i}"));
        assert!(new.claim(&k, &options).await.unwrap().is_acquired());
        clock.advance(2 * LEASE);
        let (mine, theirs) = tokio::join!(new.claim(&k, &options), old.claim(&k, LEASE));
        match (mine.unwrap(), theirs) {
            (Claim::Acquired(lease), OldClaim::InFlight) => assert_eq!(lease.fence, 2),
            (Claim::InFlight { attempt: 2, .. }, OldClaim::Acquired { fence: 2, .. }) => {}
            (mine, theirs) => panic!("exactly one takes {k:?} over: {mine:?} / {theirs:?}"),
        }
    }
    eprintln!("acquired by this version / by the previous one: {won:?}");
}
