//! The [`DedupStore`] trait: the contract every backend keeps.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, Failure, Key, Lease,
    PurgeOptions, PurgeReport, Record, Result,
};

/// The result of one item in a batch: the same value or contract error the single
/// operation would have returned.
pub type ItemResult<T> = Result<T>;

/// A store of dedup records: who processed which message, and who is processing it now.
///
/// Used mostly as `Arc<dyn DedupStore>`. Every method is one atomic operation on the
/// storage; batches are one round trip where [`Capabilities::native_batch`] says so.
///
/// # Contract
///
/// Records are absent, in flight (token, fence, attempt, expires_at, fingerprint) or
/// completed (processed_at, outcome, fingerprint, the committing token). "now" is the
/// store's clock: the server's by default for server-backed stores, or an injected
/// [`Clock`](crate::Clock). A lease is live while `now < expires_at`.
///
/// | operation | record before | result | record after |
/// |---|---|---|---|
/// | claim | absent | `Acquired(lease)` fence 1, attempt 1 | in flight |
/// | claim | in flight, lease live | `InFlight { expires_at, attempt }` | unchanged |
/// | claim | in flight, lease expired or released | `Acquired(lease)` fence+1, attempt+1 (a takeover) | in flight, new token |
/// | claim | completed | `Completed { processed_at, outcome }` | unchanged |
/// | claim with fingerprint F | any record holding fingerprint G != F | `Err(FingerprintMismatch)` | unchanged |
/// | commit(lease, outcome) | in flight with this token (expired or not) | `Ok` | completed |
/// | commit(lease) again | completed by this same token | `Ok` (commit is retry-safe; the first outcome stays) | unchanged |
/// | commit / renew / release | anything else (taken over, purged, completed by another) | `Err(LeaseLost)` | unchanged |
/// | renew(lease, d) | in flight with this token | new lease, expires now+d | in flight |
/// | release(lease) | in flight with this token | `Ok` (again: `Ok`) | in flight, expires_at = min(expires_at, now); fence and attempt kept |
/// | release_failed(lease, failure) | in flight with this token | `Ok` | as release, and `last_failure = failure` |
/// | purge(retention) | completed with processed_at < now-retention; in flight expired before now-retention | count removed | absent |
/// | purge | in flight, lease live | never removed | unchanged |
///
/// Details the table leaves open, decided here:
/// - A claim without a fingerprint never mismatches. A takeover stores the claim's
///   fingerprint when it carries one and keeps the stored one otherwise.
/// - Renew and release act on an in-flight record holding the lease's token even after the
///   lease expired, as long as nobody took the key over.
/// - Purge removes a key's record entirely; a later claim of that key starts again at
///   fence 1. Retention must therefore outlast every redelivery of a message.
///
/// Invariants (proved for every backend by `dedup-conformance`):
/// 1. Under any concurrency at most one live lease exists per key, and a key is completed
///    at most once.
/// 2. Fences for a key strictly increase across acquisitions, also across release.
/// 3. A duplicate is an outcome, never an error: concurrent claims of one key return
///    exactly one `Acquired` and otherwise `InFlight` / `Completed`.
/// 4. Invalid input is [`Error::InvalidInput`](crate::Error::InvalidInput) and nothing is
///    written (a batch with one invalid item writes nothing at all).
/// 5. Errors keep their source and say whether a retry can help
///    ([`Error::is_retryable`](crate::Error::is_retryable)).
///
/// Batches (`claim_many`, `commit_many`) mean the single operations applied in order, a key
/// repeated inside one batch included. Per-item contract outcomes (`FingerprintMismatch`,
/// `LeaseLost`) are per-item results; invalid input and storage failures fail the whole
/// call.
#[async_trait]
pub trait DedupStore: Send + Sync {
    /// Try to become the one worker that processes `key`.
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim>;

    /// [`claim`](Self::claim) for each request, in order, in one round trip where the
    /// backend can. At most [`MAX_BATCH_LEN`](crate::MAX_BATCH_LEN) requests.
    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>>;

    /// Extend a live (or expired but not taken over) lease to expire `extend_by` from now.
    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease>;

    /// Mark the leased key processed, storing `outcome` for duplicates to get back.
    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()>;

    /// [`commit`](Self::commit) for each request, in order, in one round trip where the
    /// backend can. At most [`MAX_BATCH_LEN`](crate::MAX_BATCH_LEN) requests.
    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>>;

    /// Give the key up after a failure so the next delivery can retry at once.
    async fn release(&self, lease: &Lease) -> Result<()>;

    /// [`release`](Self::release), and keep `failure` (why this attempt failed) on the
    /// record as its [`Record::last_failure`], replacing the one it had: what the
    /// [`Inbox`](crate::Inbox) does after a failed attempt, so an operator can read the
    /// cause with [`get`](Self::get) or `dedup inspect`.
    ///
    /// Same answers as `release` (`LeaseLost` when the lease is no longer held, and nothing
    /// is written then). The failure must fit [`MAX_FAILURE_LEN`](crate::MAX_FAILURE_LEN)
    /// encoded ([`Failure::validate`]): otherwise [`Error::InvalidInput`](crate::Error) and
    /// nothing is written. The cause stays through takeovers, renewals, plain releases and
    /// the commit, until the next `release_failed` replaces it or the record is removed.
    async fn release_failed(&self, lease: &Lease, failure: &Failure) -> Result<()>;

    /// The stored record of `key`, if any (expired leases included: compare `expires_at`).
    async fn get(&self, key: &Key) -> Result<Option<Record>>;

    /// Remove records that can no longer matter, in batches. A purge that finishes is kept
    /// as the store's last run ([`Admin::last_purge`](crate::Admin::last_purge)); failing to
    /// keep it is logged and does not fail the purge.
    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport>;

    /// What this store can do.
    fn capabilities(&self) -> Capabilities;
}

macro_rules! forward_store {
    ($($ptr:ty),*) => {$(
        #[async_trait]
        impl<S: DedupStore + ?Sized> DedupStore for $ptr {
            async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
                (**self).claim(key, options).await
            }
            async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
                (**self).claim_many(requests).await
            }
            async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
                (**self).renew(lease, extend_by).await
            }
            async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
                (**self).commit(lease, outcome).await
            }
            async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
                (**self).commit_many(requests).await
            }
            async fn release(&self, lease: &Lease) -> Result<()> {
                (**self).release(lease).await
            }
            async fn release_failed(&self, lease: &Lease, failure: &Failure) -> Result<()> {
                (**self).release_failed(lease, failure).await
            }
            async fn get(&self, key: &Key) -> Result<Option<Record>> {
                (**self).get(key).await
            }
            async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
                (**self).purge(options).await
            }
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
        }
    )*};
}

// Only `Arc`: every `Storage` is a `DedupStore` by a blanket implementation, and a
// downstream crate may implement `Storage` for `Box<T>` or `&T` (both are fundamental
// types), which a forwarding impl for them would overlap.
forward_store!(Arc<S>);
