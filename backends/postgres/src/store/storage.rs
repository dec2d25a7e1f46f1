//! [`PostgresStore`]'s [`Storage`] implementation: single claims and commits alone when no
//! other waits ([`super::claim_commit`]'s fresh-key and held-lease statements first), else
//! through the group commit queues when they are on ([`super::grouped`]), batches as statement rounds on
//! one connection ([`super::claim_commit`]), and renew, release and get as one statement
//! each.

use std::time::Duration;

use async_trait::async_trait;
use dedup_core::backend::{Storage, attempt_from, fence_from};
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, Error, ItemResult, Key, Lease,
    Record, Result, Timestamp, duration_millis,
};
use sqlx::Row;

use super::PostgresStore;
use crate::decode::decode_record;
use crate::error::{Backend, again_if_moved, backend};
use crate::rounds::CommitRef;

#[async_trait]
impl Storage for PostgresStore {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        let claims = if self.lazy_claims {
            &self.inner.lazy_claims
        } else {
            &self.inner.claims
        };
        let Some(group) = claims else {
            return self.claim_one(key, options).await;
        };
        if let Some(_round) = group.alone() {
            return self.claim_one(key, options).await;
        }
        let request = ClaimRequest::new(key.clone(), options.clone());
        group
            .submit(request, |requests| self.clone().claim_group(requests))
            .await
    }

    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn().await?;
        self.run_claims(&mut conn, requests).await
    }

    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        let row = again_if_moved(|| {
            sqlx::query(self.inner.sql.renew.clone())
                .bind(self.now_param())
                .bind(lease.key.consumer())
                .bind(lease.key.message_id())
                .bind(lease.token.to_string())
                .bind(duration_millis(extend_by))
                .fetch_optional(&self.inner.pool)
        })
        .await
        .map_err(backend)?
        .ok_or_else(|| Error::lease_lost(&lease.key))?;
        let fence = fence_from(&lease.key, row.try_get("fence").map_err(backend)?)?;
        let attempt = attempt_from(
            &lease.key,
            row.try_get::<i32, _>("attempt").map_err(backend)?.into(),
        )?;
        Ok(Lease {
            key: lease.key.clone(),
            token: lease.token,
            fence,
            attempt,
            expires_at: Timestamp::from_millis(row.try_get("expires_at").map_err(backend)?),
        })
    }

    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        let Some(group) = &self.inner.commits else {
            return self.commit_one(lease, outcome).await;
        };
        if let Some(_round) = group.alone() {
            return self.commit_one(lease, outcome).await;
        }
        let request = CommitRequest {
            lease: lease.clone(),
            outcome: outcome.map(<[u8]>::to_vec),
        };
        group
            .submit(request, |requests| self.clone().commit_group(requests))
            .await
    }

    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let refs: Vec<CommitRef<'_>> = requests.iter().map(CommitRef::from).collect();
        let mut conn = self.conn().await?;
        self.run_commits(&mut conn, &refs).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        again_if_moved(|| {
            sqlx::query(self.inner.sql.release.clone())
                .bind(self.now_param())
                .bind(lease.key.consumer())
                .bind(lease.key.message_id())
                .bind(lease.token.to_string())
                .fetch_optional(&self.inner.pool)
        })
        .await
        .map_err(backend)?
        .map(|_| ())
        .ok_or_else(|| Error::lease_lost(&lease.key))
    }

    async fn release_failed(&self, lease: &Lease, failure: &dedup_core::Failure) -> Result<()> {
        let encoded = failure.encode();
        again_if_moved(|| {
            sqlx::query(self.inner.sql.release_failed.clone())
                .bind(self.now_param())
                .bind(lease.key.consumer())
                .bind(lease.key.message_id())
                .bind(lease.token.to_string())
                .bind(encoded.clone())
                .fetch_optional(&self.inner.pool)
        })
        .await
        .map_err(backend)?
        .map(|_| ())
        .ok_or_else(|| Error::lease_lost(&lease.key))
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        let sql = self.inner.sql.get.clone();
        dedup_sql::store::record::<Backend>(&self.inner.pool, sql, key, decode_record).await
    }

    fn capabilities(&self) -> Capabilities {
        dedup_sql::capabilities::capabilities(self.inner.config.clock.is_none())
    }

    async fn record_purge(&self, report: &dedup_core::PurgeReport) -> Result<()> {
        self.record_purge_run(report).await
    }
}
