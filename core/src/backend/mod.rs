//! For authors of backends: the pieces every store shares, so each rule that is not about
//! storage lives in one place.
//!
//! A backend implements [`Storage`] (the operations, with inputs already validated, plus
//! [`PurgeBatches`] for one purge batch) and [`AdminStorage`] (the operator's reads). Two
//! blanket implementations (in `front_door.rs`) turn them into a
//! [`DedupStore`](crate::DedupStore) and an [`Admin`](crate::Admin): each public method first runs its check from [`check`] (the
//! same checks, in the same order, for every store: nothing is written when one fails),
//! then calls the backend; `purge` runs the shared [`purge`] driver (batches, limits,
//! pacing, the report) over the backend's [`PurgeBatches::purge_batch`]. Entry points
//! that are not on a trait (the SQL backends' transactional methods) call the same
//! [`check`] functions first.
//!
//! The outbox has the same front door: a backend implements [`OutboxStorage`], and the
//! blanket implementation (in `outbox_front_door.rs`) makes it an
//! [`OutboxStore`](crate::outbox::OutboxStore) whose methods check their input first
//! (take limits and holds, id counts, retry delays, purge options, listing limits; the
//! error text cut to [`MAX_ERROR_LEN`](crate::outbox::MAX_ERROR_LEN)) and name the
//! operation in every backend error ("taking outbox rows", ...).
//!
//! Records read back from storage go through [`RawRecord::decode`], which applies the
//! contract's checks (fence and attempt start at 1, an in-flight record has a token and an
//! expiry, a completed one a processing time) the same way for every backend.
//!
//! Users of the library need none of this: the crate root has what they use.

pub mod check;
mod decode;
mod front_door;
pub mod names;
pub mod outbox;
mod outbox_front_door;
pub mod purge;
pub mod transition;
pub mod url;

use std::time::Duration;

pub use crate::verdict::{DEAD_LETTER_PREFIX_HEX, FAILED_PREFIX_HEX};
pub use decode::{RawRecord, RawState, attempt_from, fence_from};
pub use purge::{PurgeBatch, PurgeBatches, PurgeStep};

use crate::admin::{Forgot, ListFilter, PurgeCount, Stats};
use crate::outbox::{AfterFailure, DestinationStats, Held, OutboxEntry, OutboxQuery, OutboxStats};
use crate::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, ItemResult, Key, Lease,
    LeaseToken, PurgeOptions, PurgeReport, PurgeRun, Record, Result, Timestamp,
};
use async_trait::async_trait;
use futures::stream::BoxStream;

/// The operations a backend implements; every `Storage` is a
/// [`DedupStore`](crate::DedupStore) through the blanket implementation in this module,
/// which checks the input first.
///
/// Each method has the meaning of the [`DedupStore`](crate::DedupStore) method of the same
/// name (the contract is in its `# Contract`), and is only ever called with input that
/// passed [`check`]: lease durations, outcomes and batch lengths are within the limits.
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
    /// [`DedupStore::release_failed`](crate::DedupStore::release_failed); `failure` passed
    /// [`check::release_failed`].
    async fn release_failed(&self, lease: &Lease, failure: &crate::Failure) -> Result<()>;
    /// [`DedupStore::get`](crate::DedupStore::get).
    async fn get(&self, key: &Key) -> Result<Option<Record>>;
    /// [`DedupStore::capabilities`](crate::DedupStore::capabilities).
    fn capabilities(&self) -> Capabilities;
    /// Keep `report` as the store's last purge run ([`PurgeRun::of`] at the store's "now",
    /// replacing the run kept before), for [`AdminStorage::last_purge`]. Called by the front
    /// door after every purge that finished; an error here is logged and never fails the
    /// purge.
    async fn record_purge(&self, report: &PurgeReport) -> Result<()>;
}

/// The operator's operations a backend implements; every `AdminStorage` is an
/// [`Admin`](crate::Admin) through the blanket implementation in this module, which checks
/// the input first. Each method but [`revoke`](Self::revoke) has the meaning of the `Admin`
/// method of the same name; `Admin::release_key` is built from `get` and `revoke`.
#[async_trait]
pub trait AdminStorage: Storage {
    /// [`Admin::now`](crate::Admin::now).
    async fn now(&self) -> Result<Timestamp>;
    /// [`Admin::list`](crate::Admin::list); `filter` passed [`check::list`].
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>>;
    /// [`Admin::stats`](crate::Admin::stats); `top` passed [`check::stats`].
    async fn stats(&self, top: usize) -> Result<Stats>;
    /// [`Admin::consumers`](crate::Admin::consumers).
    async fn consumers(&self) -> Result<Vec<crate::admin::ConsumerCounts>>;
    /// [`Admin::count_purgeable`](crate::Admin::count_purgeable).
    async fn count_purgeable(&self, retention: Duration) -> Result<PurgeCount>;
    /// [`Admin::last_purge`](crate::Admin::last_purge): what the last
    /// [`record_purge`](Storage::record_purge) kept.
    async fn last_purge(&self) -> Result<Option<PurgeRun>>;
    /// [`Admin::forget`](crate::Admin::forget), as one atomic operation on the storage
    /// ([`transition::forget`] at the store's "now"): a record is removed only if, at the
    /// instant it is removed, it holds no live lease or `force` is given, so a record a
    /// worker just claimed is never removed without `force`.
    async fn forget(&self, key: &Key, force: bool) -> Result<Forgot>;
    /// As one atomic operation on the storage: if `key`'s record is in flight holding
    /// `token`, and its lease is not live or `force` is given, expire the lease and replace
    /// its token by `new_token` ([`transition::revoke`] at the store's "now") and answer
    /// `true`; otherwise change nothing and answer `false`.
    async fn revoke(
        &self,
        key: &Key,
        token: LeaseToken,
        force: bool,
        new_token: LeaseToken,
    ) -> Result<bool>;
    /// [`Admin::count_source`](crate::Admin::count_source).
    async fn count_source(&self) -> Result<crate::admin::CountSource> {
        Ok(crate::admin::CountSource::Scan { keepable: false })
    }
    /// [`Admin::enable_counts`](crate::Admin::enable_counts).
    async fn enable_counts(&self) -> Result<bool> {
        Err(crate::Error::Unsupported("kept counts"))
    }
    /// [`Admin::disable_counts`](crate::Admin::disable_counts).
    async fn disable_counts(&self) -> Result<bool> {
        Err(crate::Error::Unsupported("kept counts"))
    }
}

/// The outbox operations a backend implements; every `OutboxStorage` is an
/// [`OutboxStore`](crate::outbox::OutboxStore) through the blanket implementation in this
/// module, which checks the input first and names the operation in every backend error.
///
/// Each method has the meaning of the `OutboxStore` method of the same name (the contract
/// is in its `# Contract`), and is only ever called with input that passed [`check`]:
/// `take`'s limit is 1 to [`MAX_OUTBOX_TAKE`](check::MAX_OUTBOX_TAKE) and its hold within
/// the lease limits; marked and handed-back ids are at most as many; a retry delay is at
/// most [`MAX_DELAY`](crate::outbox::MAX_DELAY); `error` is already cut to
/// [`MAX_ERROR_LEN`](crate::outbox::MAX_ERROR_LEN); purge options are valid; a listing's
/// `limit` is the one to use (1 to [`MAX_OUTBOX_LIST`](check::MAX_OUTBOX_LIST), never 0).
/// A SQL backend's `purge` is usually the shared [`purge::run`] over its
/// [`PurgeBatches`].
#[async_trait]
pub trait OutboxStorage: Send + Sync + std::fmt::Debug {
    /// `OutboxStore::backend`.
    fn backend(&self) -> &'static str;
    /// `OutboxStore::take`.
    async fn take(&self, limit: usize, hold: Duration) -> Result<Held>;
    /// `OutboxStore::mark_sent`.
    async fn mark_sent(&self, token: &LeaseToken, ids: &[i64]) -> Result<Vec<i64>>;
    /// `OutboxStore::mark_failed`.
    async fn mark_failed(
        &self,
        token: &LeaseToken,
        id: i64,
        error: &str,
        after: AfterFailure,
    ) -> Result<bool>;
    /// `OutboxStore::hand_back`.
    async fn hand_back(&self, token: &LeaseToken, ids: &[i64]) -> Result<u64>;
    /// `OutboxStore::purge`.
    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport>;
    /// `OutboxStore::stats`.
    async fn stats(&self) -> Result<OutboxStats>;
    /// `OutboxStore::stats_by_destination`, in destination order.
    async fn stats_by_destination(&self) -> Result<Vec<DestinationStats>>;
    /// `OutboxStore::list`.
    async fn list(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>>;
    /// `OutboxStore::retry`.
    async fn retry(&self, id: i64) -> Result<bool>;
    /// `OutboxStore::wakeups` (default: none, the relay polls).
    async fn wakeups(&self) -> Result<Option<BoxStream<'static, Result<()>>>> {
        Ok(None)
    }
}
