//! For authors of backends: the pieces every store shares, so each rule that is not about
//! storage lives in one place.
//!
//! A backend implements [`Storage`] (the operations, with inputs already validated) and
//! invokes [`impl_dedup_store!`](crate::impl_dedup_store) once. The macro writes its
//! [`DedupStore`](crate::DedupStore) implementation: every method validates its input (the
//! same checks, in the same order, for every store: nothing is written when one fails),
//! then calls the backend; `purge` runs the shared [`purge`] driver (batches, limits,
//! pacing, the report) over the backend's [`PurgeBatches::purge_batch`].
//!
//! Records read back from storage go through [`RawRecord::decode`], which applies the
//! contract's checks (fence and attempt start at 1, an in-flight record has a token and an
//! expiry, a completed one a processing time) the same way for every backend.
//!
//! Users of the library need none of this: the crate root has what they use.

mod decode;
pub mod purge;

use std::time::Duration;

#[doc(hidden)]
pub use async_trait::async_trait;

pub use decode::{RawRecord, RawState, attempt_from, fence_from};
pub use purge::{PurgeBatch, PurgeBatches, PurgeStep};

use crate::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, ItemResult, Key, Lease, Record,
    Result,
};

/// The operations a backend implements; [`impl_dedup_store!`](crate::impl_dedup_store)
/// turns them into a [`DedupStore`](crate::DedupStore).
///
/// Each method has the meaning of the [`DedupStore`](crate::DedupStore) method of the same
/// name (see its `# Contract`), and is only ever called with input that passed validation:
/// the lease durations, outcomes and batch lengths are within the limits.
///
/// `purge` is built from [`PurgeBatches`] (a supertrait) by the shared [`purge`] driver.
#[async_trait]
pub trait Storage: PurgeBatches {
    /// [`DedupStore::claim`](crate::DedupStore::claim).
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim>;
    /// [`DedupStore::claim_many`](crate::DedupStore::claim_many).
    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>>;
    /// [`DedupStore::renew`](crate::DedupStore::renew).
    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease>;
    /// [`DedupStore::commit`](crate::DedupStore::commit).
    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()>;
    /// [`DedupStore::commit_many`](crate::DedupStore::commit_many).
    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>>;
    /// [`DedupStore::release`](crate::DedupStore::release).
    async fn release(&self, lease: &Lease) -> Result<()>;
    /// [`DedupStore::get`](crate::DedupStore::get).
    async fn get(&self, key: &Key) -> Result<Option<Record>>;
    /// [`DedupStore::capabilities`](crate::DedupStore::capabilities).
    fn capabilities(&self) -> Capabilities;
}

/// Validate every request of a `claim_many` before anything is written.
pub fn validate_claim_batch(requests: &[ClaimRequest]) -> Result<()> {
    crate::validate_batch_len(requests.len())?;
    requests.iter().try_for_each(|r| r.options.validate())
}

/// Validate every request of a `commit_many` before anything is written.
pub fn validate_commit_batch(requests: &[CommitRequest]) -> Result<()> {
    crate::validate_batch_len(requests.len())?;
    requests
        .iter()
        .try_for_each(|r| crate::validate_outcome(r.outcome.as_deref()))
}

/// Implement [`DedupStore`](crate::DedupStore) for a type implementing
/// [`Storage`](crate::backend::Storage): validation first, then the backend; `purge` through
/// the shared [`purge`](crate::backend::purge) driver. A backend error says which operation
/// failed ([`Error::during`](crate::Error::during): "claiming", "committing"...).
///
/// ```ignore
/// dedup_core::impl_dedup_store!(SqliteStore);
/// ```
#[macro_export]
macro_rules! impl_dedup_store {
    ($store:ty) => {
        #[$crate::backend::async_trait]
        impl $crate::DedupStore for $store {
            async fn claim(
                &self,
                key: &$crate::Key,
                options: &$crate::ClaimOptions,
            ) -> $crate::Result<$crate::Claim> {
                options.validate()?;
                <Self as $crate::backend::Storage>::claim(self, key, options)
                    .await
                    .map_err(|e| e.during("claiming"))
            }
            async fn claim_many(
                &self,
                requests: &[$crate::ClaimRequest],
            ) -> $crate::Result<::std::vec::Vec<$crate::ItemResult<$crate::Claim>>> {
                $crate::backend::validate_claim_batch(requests)?;
                <Self as $crate::backend::Storage>::claim_many(self, requests)
                    .await
                    .map_err(|e| e.during("claiming a batch"))
            }
            async fn renew(
                &self,
                lease: &$crate::Lease,
                extend_by: ::std::time::Duration,
            ) -> $crate::Result<$crate::Lease> {
                $crate::validate_lease(extend_by)?;
                <Self as $crate::backend::Storage>::renew(self, lease, extend_by)
                    .await
                    .map_err(|e| e.during("renewing a lease"))
            }
            async fn commit(
                &self,
                lease: &$crate::Lease,
                outcome: ::std::option::Option<&[u8]>,
            ) -> $crate::Result<()> {
                $crate::validate_outcome(outcome)?;
                <Self as $crate::backend::Storage>::commit(self, lease, outcome)
                    .await
                    .map_err(|e| e.during("committing"))
            }
            async fn commit_many(
                &self,
                requests: &[$crate::CommitRequest],
            ) -> $crate::Result<::std::vec::Vec<$crate::ItemResult<()>>> {
                $crate::backend::validate_commit_batch(requests)?;
                <Self as $crate::backend::Storage>::commit_many(self, requests)
                    .await
                    .map_err(|e| e.during("committing a batch"))
            }
            async fn release(&self, lease: &$crate::Lease) -> $crate::Result<()> {
                <Self as $crate::backend::Storage>::release(self, lease)
                    .await
                    .map_err(|e| e.during("releasing a lease"))
            }
            async fn get(
                &self,
                key: &$crate::Key,
            ) -> $crate::Result<::std::option::Option<$crate::Record>> {
                <Self as $crate::backend::Storage>::get(self, key)
                    .await
                    .map_err(|e| e.during("reading a record"))
            }
            async fn purge(
                &self,
                options: &$crate::PurgeOptions,
            ) -> $crate::Result<$crate::PurgeReport> {
                $crate::backend::purge::run(self, options)
                    .await
                    .map_err(|e| e.during("purging"))
            }
            fn capabilities(&self) -> $crate::Capabilities {
                <Self as $crate::backend::Storage>::capabilities(self)
            }
        }
    };
}
