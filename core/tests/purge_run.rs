//! The last purge run: a store that cannot keep it still purges, and says so in a warning
//! naming the store and the cause.

mod support;

use std::time::Duration;

use async_trait::async_trait;
use dedup_core::backend::{PurgeBatch, PurgeBatches, PurgeStep, Storage};
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Error, Failure,
    ItemResult, Key, Lease, MemoryStore, PurgeOptions, PurgeReport, Record, Result,
};
use support::warnings::Warnings;

/// A memory store whose storage cannot keep a purge run (a full disk, say).
#[derive(Debug)]
struct Unkept(MemoryStore);

#[async_trait]
impl PurgeBatches for Unkept {
    type PurgeCursor = ();
    async fn purge_batch(&self, step: &PurgeStep, cursor: &mut ()) -> Result<PurgeBatch> {
        PurgeBatches::purge_batch(&self.0, step, cursor).await
    }
}

#[async_trait]
impl Storage for Unkept {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        Storage::claim(&self.0, key, options).await
    }
    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        Storage::claim_many(&self.0, requests).await
    }
    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        Storage::renew(&self.0, lease, extend_by).await
    }
    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        Storage::commit(&self.0, lease, outcome).await
    }
    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        Storage::commit_many(&self.0, requests).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        Storage::release(&self.0, lease).await
    }
    async fn release_failed(&self, lease: &Lease, failure: &Failure) -> Result<()> {
        Storage::release_failed(&self.0, lease, failure).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        Storage::get(&self.0, key).await
    }
    fn capabilities(&self) -> Capabilities {
        Storage::capabilities(&self.0)
    }
    async fn record_purge(&self, _: &PurgeReport) -> Result<()> {
        Err(Error::backend("unkept", true, "no space left on device"))
    }
}

#[tokio::test]
async fn a_run_that_cannot_be_kept_never_fails_the_purge() {
    let warnings = Warnings::default();
    let _guard = tracing::subscriber::set_default(warnings.clone());
    let store = Unkept(MemoryStore::new());
    let key = Key::new("billing", "old").unwrap();
    let lease = DedupStore::claim(&store, &key, &ClaimOptions::default())
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    DedupStore::commit(&store, &lease, None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;

    let report = DedupStore::purge(&store, &PurgeOptions::older_than(Duration::ZERO).unpaced())
        .await
        .expect("the purge succeeds though its run is not kept");
    assert_eq!(report.completed, 1, "{report:?}");
    let left = DedupStore::get(&store, &key).await.unwrap();
    assert!(left.is_none(), "purged: {left:?}");
    let seen = warnings.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let warning = &seen[0];
    assert!(
        warning["store"].contains("Unkept"),
        "the warning names the store: {warning:?}"
    );
    assert!(
        warning["error"].contains("no space left on device"),
        "and the cause: {warning:?}"
    );
    assert!(
        warning["message"].contains("not recorded"),
        "and what was not done: {warning:?}"
    );
}
