//! Proof that the suite catches faults in this backend's own SQL: copies of `MySqlStore`
//! with one operation rewritten the way a hasty author might (on the same real table), and
//! the clause that must catch each. The unbroken store passes the same clauses
//! (`tests/conformance.rs`).

mod common;

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use async_trait::async_trait;
use dedup_conformance::clauses::{
    concurrent_claims_of_one_key_acquire_exactly_once, stale_commit_after_takeover_is_rejected,
};
use dedup_conformance::{StoreFactory, TestContext};
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Error, ItemResult,
    Key, Lease, LeaseToken, PurgeOptions, PurgeReport, Record, RecordState, Result,
};
use dedup_mysql::MySqlStore;
use dedup_mysql::sqlx::{self, AssertSqlSafe};
use futures::FutureExt;

/// One deliberate fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// A claim that reads the record (unlocked), then writes its lease over whatever is
    /// there: check-then-act, no lock, no condition on the write.
    CheckThenActClaim,
    /// A commit that completes the key whoever holds it (no token in the `WHERE`).
    CommitWithoutTokenCheck,
}

/// The real store, with `fault` in one operation.
struct Broken {
    store: MySqlStore,
    fault: Fault,
    clock: std::sync::Arc<dedup_core::ManualClock>,
}

#[async_trait]
impl DedupStore for Broken {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        if self.fault != Fault::CheckThenActClaim {
            return self.store.claim(key, options).await;
        }
        let now = dedup_core::Clock::now(&*self.clock);
        let (fence, attempt) = match self.store.get(key).await? {
            None => (1, 1),
            Some(Record {
                state: RecordState::InFlight { expires_at, .. },
                fence,
                attempt,
                ..
            }) if expires_at <= now => (fence + 1, attempt + 1),
            Some(Record {
                state: RecordState::InFlight { expires_at, .. },
                attempt,
                ..
            }) => {
                return Ok(Claim::InFlight {
                    expires_at,
                    attempt,
                });
            }
            Some(Record {
                state:
                    RecordState::Completed {
                        processed_at,
                        outcome,
                        ..
                    },
                ..
            }) => {
                return Ok(Claim::Completed {
                    processed_at,
                    outcome,
                });
            }
        };
        // The window between the check and the act, widened so the race shows every run.
        tokio::time::sleep(Duration::from_millis(2)).await;
        let token = LeaseToken::random();
        let expires_at = now.saturating_add(options.lease);
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} (consumer, message_id, token, fence, attempt, claimed_at, expires_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE token = VALUES(token), \
             fence = VALUES(fence), attempt = VALUES(attempt), claimed_at = VALUES(claimed_at), \
             expires_at = VALUES(expires_at), processed_at = NULL, outcome = NULL",
            self.store.table()
        )))
        .bind(key.consumer())
        .bind(key.message_id())
        .bind(token.to_string())
        .bind(fence as i64)
        .bind(i64::from(attempt))
        .bind(now.as_millis())
        .bind(expires_at.as_millis())
        .execute(self.store.pool())
        .await
        .map_err(|e| Error::backend("mysql", false, e))?;
        Ok(Claim::Acquired(Lease {
            key: key.clone(),
            token,
            fence,
            attempt,
            expires_at,
        }))
    }

    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        self.store.claim_many(requests).await
    }

    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        self.store.renew(lease, extend_by).await
    }

    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        if self.fault != Fault::CommitWithoutTokenCheck {
            return self.store.commit(lease, outcome).await;
        }
        let now = dedup_core::Clock::now(&*self.clock);
        let done = sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET processed_at = ?, expires_at = NULL, outcome = ? \
             WHERE consumer = ? AND message_id = ? AND processed_at IS NULL",
            self.store.table()
        )))
        .bind(now.as_millis())
        .bind(outcome)
        .bind(lease.key.consumer())
        .bind(lease.key.message_id())
        .execute(self.store.pool())
        .await
        .map_err(|e| Error::backend("mysql", false, e))?;
        match done.rows_affected() {
            1 => Ok(()),
            _ => self.store.commit(lease, outcome).await,
        }
    }

    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        self.store.commit_many(requests).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.store.release(lease).await
    }

    async fn release_failed(&self, lease: &Lease, failure: &dedup_core::Failure) -> Result<()> {
        self.store.release_failed(lease, failure).await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        self.store.get(key).await
    }

    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        self.store.purge(options).await
    }

    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }
}

struct BrokenFactory(Fault);

#[async_trait]
impl StoreFactory for BrokenFactory {
    type Store = Broken;

    async fn open(&self, ctx: &TestContext) -> Broken {
        let url = common::url().expect("available() checked the URL");
        Broken {
            store: common::store_on(&url, &ctx.namespace, Some(ctx.clock.clone())).await,
            fault: self.0,
            clock: ctx.clock.clone(),
        }
    }

    fn available(&self) -> bool {
        common::url().is_some()
    }
}

/// Whether `clause` fails (panics) against the store broken by `fault`.
async fn fails<Fut: std::future::Future<Output = ()>>(clause: Fut) -> bool {
    AssertUnwindSafe(clause).catch_unwind().await.is_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unlocked_check_then_act_claim_is_caught() {
    let factory = BrokenFactory(Fault::CheckThenActClaim);
    if !factory.available() {
        eprintln!("SKIPPED: DEDUP_MYSQL_URL is not set");
        return;
    }
    assert!(
        fails(concurrent_claims_of_one_key_acquire_exactly_once(&factory)).await,
        "64 racing claims on a check-then-act claim must acquire more than once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_without_its_token_check_is_caught() {
    let factory = BrokenFactory(Fault::CommitWithoutTokenCheck);
    if !factory.available() {
        eprintln!("SKIPPED: DEDUP_MYSQL_URL is not set");
        return;
    }
    assert!(
        fails(stale_commit_after_takeover_is_rejected(&factory)).await,
        "a stale lease's commit must not complete the new holder's record"
    );
}
