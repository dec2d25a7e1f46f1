//! The front door: every [`Storage`] is a [`DedupStore`] and every [`AdminStorage`] an
//! [`Admin`], with each
//! method's input checked by [`check`](super::check) before the backend runs, and a
//! backend error saying which operation failed ([`Error::during`](crate::Error::during):
//! "claiming", "committing"...).
//!
//! Two blanket implementations rather than a macro each backend invokes, or a checked
//! wrapper type around each backend: a store author implements plain traits and cannot get
//! an unchecked `DedupStore` by forgetting a step, the checks read as ordinary code, and
//! the public store types stay the backends' own (`SqliteStore`, not a wrapper of it).
//! The price is coherence: a type must not implement both `Storage` and `DedupStore` by
//! hand, and `DedupStore` is forwarded for `Arc<S>` only (a downstream crate may implement
//! `Storage` for `Box<T>` or `&T`, which would overlap with forwarding impls for those).

use std::time::Duration;

use async_trait::async_trait;

use super::{AdminStorage, Storage, check, purge};
use crate::admin::{Forgot, ListFilter, PurgeCount, Released, Stats};
use crate::{
    Admin, Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Error,
    Failure, ItemResult, Key, Lease, LeaseToken, PurgeOptions, PurgeReport, PurgeRun, Record,
    RecordState, Result, Timestamp,
};

#[async_trait]
impl<S: Storage> DedupStore for S {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        check::claim(options)?;
        Storage::claim(self, key, options)
            .await
            .map_err(|e| e.during("claiming"))
    }

    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        check::claim_many(requests)?;
        Storage::claim_many(self, requests)
            .await
            .map_err(|e| e.during("claiming a batch"))
    }

    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        check::renew(extend_by)?;
        Storage::renew(self, lease, extend_by)
            .await
            .map_err(|e| e.during("renewing a lease"))
    }

    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        check::commit(outcome)?;
        Storage::commit(self, lease, outcome)
            .await
            .map_err(|e| e.during("committing"))
    }

    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        check::commit_many(requests)?;
        Storage::commit_many(self, requests)
            .await
            .map_err(|e| e.during("committing a batch"))
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        Storage::release(self, lease)
            .await
            .map_err(|e| e.during("releasing a lease"))
    }

    async fn release_failed(&self, lease: &Lease, failure: &Failure) -> Result<()> {
        check::release_failed(failure)?;
        Storage::release_failed(self, lease, failure)
            .await
            .map_err(|e| e.during("releasing a lease with its failure"))
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        Storage::get(self, key)
            .await
            .map_err(|e| e.during("reading a record"))
    }

    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        let report = purge::run(self, options)
            .await
            .map_err(|e| e.during("purging"))?;
        if let Err(e) = Storage::record_purge(self, &report).await {
            tracing::warn!(
                store = std::any::type_name::<S>(),
                error = %crate::error_chain(&e.during("recording the last purge run")),
                removed = report.total(),
                "dedup purge: finished, but its run was not recorded in the store (the purge itself succeeded)"
            );
        }
        Ok(report)
    }

    fn capabilities(&self) -> Capabilities {
        Storage::capabilities(self)
    }
}

#[async_trait]
impl<S: AdminStorage> Admin for S {
    async fn now(&self) -> Result<Timestamp> {
        AdminStorage::now(self)
            .await
            .map_err(|e| e.during("reading the store's clock"))
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        check::list(filter)?;
        AdminStorage::list(self, filter)
            .await
            .map_err(|e| e.during("listing records"))
    }

    async fn stats(&self, top: usize) -> Result<Stats> {
        check::stats(top)?;
        AdminStorage::stats(self, top)
            .await
            .map_err(|e| e.during("reading stats"))
    }

    async fn consumers(&self) -> Result<Vec<crate::admin::ConsumerCounts>> {
        AdminStorage::consumers(self)
            .await
            .map_err(|e| e.during("counting records by consumer"))
    }

    async fn count_purgeable(&self, retention: Duration) -> Result<PurgeCount> {
        AdminStorage::count_purgeable(self, retention)
            .await
            .map_err(|e| e.during("counting purgeable records"))
    }

    async fn last_purge(&self) -> Result<Option<PurgeRun>> {
        AdminStorage::last_purge(self)
            .await
            .map_err(|e| e.during("reading the last purge run"))
    }

    async fn release_key(&self, key: &Key, force: bool) -> Result<Released> {
        release_key(self, key, force)
            .await
            .map_err(|e| e.during("releasing a lease by hand"))
    }

    async fn forget(&self, key: &Key, force: bool) -> Result<Forgot> {
        AdminStorage::forget(self, key, force)
            .await
            .map_err(|e| e.during("forgetting a record"))
    }

    async fn count_source(&self) -> Result<crate::admin::CountSource> {
        AdminStorage::count_source(self)
            .await
            .map_err(|e| e.during("finding where the counts come from"))
    }

    async fn enable_counts(&self) -> Result<bool> {
        AdminStorage::enable_counts(self)
            .await
            .map_err(|e| e.during("enabling kept counts"))
    }

    async fn disable_counts(&self) -> Result<bool> {
        AdminStorage::disable_counts(self)
            .await
            .map_err(|e| e.during("disabling kept counts"))
    }
}

/// How many times [`release_key`] reads the record again when the key changed hands
/// between its read and its revocation.
const RELEASE_TRIES: usize = 3;

/// `Admin::release_key`: read the record, decide at the store's "now", and revoke the lease
/// read only if the record still holds it (see [`AdminStorage::revoke`]).
async fn release_key<S: AdminStorage>(store: &S, key: &Key, force: bool) -> Result<Released> {
    for _ in 0..RELEASE_TRIES {
        let now = AdminStorage::now(store).await?;
        let Some(record) = Storage::get(store, key).await? else {
            return Ok(Released::NotFound);
        };
        let (token, expires_at) = match record.state {
            RecordState::Completed { processed_at, .. } => {
                return Ok(Released::Completed { processed_at });
            }
            RecordState::InFlight { token, expires_at } => (token, expires_at),
        };
        let was_live = now < expires_at;
        if was_live && !force {
            return Ok(Released::LiveLease {
                expires_at,
                attempt: record.attempt,
            });
        }
        if AdminStorage::revoke(store, key, token, force, LeaseToken::random()).await? {
            return Ok(Released::Released {
                fence: record.fence,
                attempt: record.attempt,
                was_live,
            });
        }
    }
    Err(Error::lease_lost(key))
}
