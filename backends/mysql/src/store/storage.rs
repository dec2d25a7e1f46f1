//! [`MySqlStore`]'s [`Storage`] implementation: the fast path first where there is one
//! ([`super::fast`]), else the contract in a locked transaction of the store's own
//! ([`super::locked`]).

use std::time::Duration;

use async_trait::async_trait;
use dedup_core::backend::Storage;
use dedup_core::backend::transition;
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, ItemResult, Key, Lease,
    LeaseToken, Record, Result, Timestamp,
};
use sqlx::AssertSqlSafe;

use crate::decode::decode_record;
use crate::error::{Backend, backend, lost_race};

use super::fast::Fast;
use super::{MySqlStore, last_insert_id};

#[async_trait]
impl Storage for MySqlStore {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        if let Fast::Done(claim) = self.claim_fresh_one(key, options).await? {
            return Ok(claim);
        }
        self.locked("claim", &[key], |w| {
            let (claim, write) =
                transition::claim(w.record(key), key, options, w.now, LeaseToken::random())?;
            w.apply(key, write, true);
            Ok(claim)
        })
        .await?
    }

    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let fresh: Vec<(&Key, &ClaimOptions)> =
            requests.iter().map(|r| (&r.key, &r.options)).collect();
        if let Fast::Done(claims) = self.claim_fresh(&fresh).await? {
            return Ok(claims.into_iter().map(Ok).collect());
        }
        let keys: Vec<&Key> = requests.iter().map(|r| &r.key).collect();
        self.locked("claim", &keys, |w| {
            requests
                .iter()
                .map(|r| {
                    let (claim, write) = transition::claim(
                        w.record(&r.key),
                        &r.key,
                        &r.options,
                        w.now,
                        LeaseToken::random(),
                    )?;
                    w.apply(&r.key, write, true);
                    Ok(claim)
                })
                .collect()
        })
        .await
    }

    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        let key = &lease.key;
        // The new expiry, when the lease was held by the token (read on the statement's
        // connection, which goes back to the pool before the locked path takes one).
        let renewed = {
            let mut conn = self.inner.pool.acquire().await.map_err(backend)?;
            let done = sqlx::query(AssertSqlSafe(self.inner.sql.renew.clone()))
                .bind(self.now_param())
                .bind(dedup_core::duration_millis(extend_by))
                .bind(key.consumer())
                .bind(key.message_id())
                .bind(lease.token.to_string())
                .execute(&mut *conn)
                .await;
            match unless_raced(done)? {
                Some(done) if done.rows_affected() == 1 => {
                    Some(last_insert_id(&mut conn, &done).await.map_err(backend)?)
                }
                _ => None,
            }
        };
        if let Some(expires_at) = renewed.and_then(|ms| i64::try_from(ms).ok()) {
            // Held by the token: the same acquisition, so the same fence and attempt.
            return Ok(Lease {
                expires_at: Timestamp::from_millis(expires_at),
                ..lease.clone()
            });
        }
        self.locked("renew", &[key], |w| {
            let (renewed, write) = transition::renew(w.record(key), lease, extend_by, w.now)?;
            w.apply(key, write, false);
            Ok(renewed)
        })
        .await?
    }

    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        if let Fast::Done(()) = self.commit_held(&[(lease, outcome)]).await? {
            return Ok(());
        }
        let key = &lease.key;
        self.locked("commit", &[key], |w| {
            let write = transition::commit(w.record(key), lease, outcome, w.now)?;
            w.apply(key, write, false);
            Ok(())
        })
        .await?
    }

    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let held: Vec<(&Lease, Option<&[u8]>)> = requests
            .iter()
            .map(|r| (&r.lease, r.outcome.as_deref()))
            .collect();
        if let Fast::Done(()) = self.commit_held(&held).await? {
            return Ok(requests.iter().map(|_| Ok(())).collect());
        }
        let keys: Vec<&Key> = requests.iter().map(|r| &r.lease.key).collect();
        self.locked("commit", &keys, |w| {
            requests
                .iter()
                .map(|r| {
                    let key = &r.lease.key;
                    let write =
                        transition::commit(w.record(key), &r.lease, r.outcome.as_deref(), w.now)?;
                    w.apply(key, write, false);
                    Ok(())
                })
                .collect()
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let key = &lease.key;
        let done = sqlx::query(AssertSqlSafe(self.inner.sql.release.clone()))
            .bind(self.now_param())
            .bind(key.consumer())
            .bind(key.message_id())
            .bind(lease.token.to_string())
            .execute(&self.inner.pool)
            .await;
        if unless_raced(done)?.is_some_and(|done| done.rows_affected() == 1) {
            return Ok(());
        }
        self.locked("release", &[key], |w| {
            let write = transition::release(w.record(key), lease, w.now)?;
            w.apply(key, write, false);
            Ok(())
        })
        .await?
    }

    async fn release_failed(&self, lease: &Lease, failure: &dedup_core::Failure) -> Result<()> {
        let key = &lease.key;
        let done = sqlx::query(AssertSqlSafe(self.inner.sql.release_failed.clone()))
            .bind(failure.encode())
            .bind(self.now_param())
            .bind(key.consumer())
            .bind(key.message_id())
            .bind(lease.token.to_string())
            .execute(&self.inner.pool)
            .await;
        if unless_raced(done)?.is_some_and(|done| done.rows_affected() == 1) {
            return Ok(());
        }
        self.locked("release", &[key], |w| {
            let write = transition::release_failed(w.record(key), lease, failure, w.now)?;
            w.apply(key, write, false);
            Ok(())
        })
        .await?
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        let sql = AssertSqlSafe(self.inner.sql.get.clone());
        dedup_sql::store::record::<Backend>(&self.inner.pool, sql, key, decode_record).await
    }

    fn capabilities(&self) -> Capabilities {
        dedup_sql::capabilities::capabilities(self.inner.config.clock.is_none())
    }

    async fn record_purge(&self, report: &dedup_core::PurgeReport) -> Result<()> {
        self.record_purge_run(report).await
    }
}

/// A fast path's autocommit update by the lease's token, as the general path sees it: the
/// result, or `None` after a race lost to a concurrent writer (a deadlock; on Galera a
/// write set that failed certification at commit), which the locked transaction decides.
fn unless_raced(
    done: std::result::Result<sqlx::mysql::MySqlQueryResult, sqlx::Error>,
) -> Result<Option<sqlx::mysql::MySqlQueryResult>> {
    match done {
        Ok(done) => Ok(Some(done)),
        Err(e) if lost_race(&e) => Ok(None),
        Err(e) => Err(backend(e)),
    }
}
