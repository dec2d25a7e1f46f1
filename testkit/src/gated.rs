//! [`Gated`]: the store as one worker sees it. Every operation first stops at its
//! [`Point`] until the driver lets the worker pass; then it runs on the store under test
//! and its answer is told in the story.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Error, ItemResult,
    Key, Lease, PurgeOptions, PurgeReport, Record, Result,
};

use crate::world::{Actor, Interrupted, Point, World};

/// The store seen by one run: stops at every operation.
pub(crate) struct Gated {
    pub(crate) world: Arc<World>,
    pub(crate) actor: Actor,
}

impl Gated {
    async fn pass(&self, point: Point) -> Result<()> {
        self.world
            .gate(&self.actor, point, false)
            .await
            .map_err(interrupted)
    }
}

/// A stopped store operation as the store's error: not retryable (a dead process retries
/// nothing; an injected failure is final for this call).
pub(crate) fn interrupted(i: Interrupted) -> Error {
    Error::backend("testkit", false, i)
}

#[async_trait]
impl DedupStore for Gated {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        self.pass(Point::Claim).await?;
        let result = self.world.store.claim(key, options).await;
        self.world.claimed(&self.actor, &result);
        result
    }

    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        self.pass(Point::ClaimMany).await?;
        self.world.store.claim_many(requests).await
    }

    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        self.pass(Point::Renew).await?;
        let result = self.world.store.renew(lease, extend_by).await;
        self.world.renewed(&self.actor, &result);
        result
    }

    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        self.pass(Point::Commit).await?;
        let result = self.world.store.commit(lease, outcome).await;
        self.world.committed(&self.actor, &result);
        result
    }

    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        self.pass(Point::CommitMany).await?;
        self.world.store.commit_many(requests).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.pass(Point::Release).await?;
        let result = self.world.store.release(lease).await;
        self.world.released(&self.actor, &result);
        result
    }

    async fn release_failed(&self, lease: &Lease, failure: &dedup_core::Failure) -> Result<()> {
        self.pass(Point::Release).await?;
        let result = self.world.store.release_failed(lease, failure).await;
        self.world.released(&self.actor, &result);
        result
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        self.pass(Point::Get).await?;
        let result = self.world.store.get(key).await;
        self.world.got(&self.actor, &result);
        result
    }

    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        self.world.store.purge(options).await
    }

    fn capabilities(&self) -> Capabilities {
        self.world.store.capabilities()
    }
}
