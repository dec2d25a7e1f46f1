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
/// storage. Batches are one round trip where [`Capabilities::native_batch`] says so.
///
/// Most consumers never call it directly: an [`Inbox`](crate::Inbox) drives it. Call it
/// yourself to claim and commit by hand, or to build your own inbox.
///
/// # Examples
///
/// The lifecycle of one key, by hand:
///
/// ```
/// use dedup_core::{Claim, ClaimOptions, DedupStore, Key, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dedup_core::Error> {
/// let store = MemoryStore::new();
/// let key = Key::new("billing", "order-42")?;
///
/// let Claim::Acquired(lease) = store.claim(&key, &ClaimOptions::default()).await? else {
///     unreachable!("a new key is acquired");
/// };
/// // ... do the work under `lease` ...
/// store.commit(&lease, Some(b"charged")).await?;
///
/// // A redelivery finds the key completed, with its outcome.
/// let again = store.claim(&key, &ClaimOptions::default()).await?;
/// assert!(matches!(again, Claim::Completed { outcome: Some(o), .. } if o == b"charged"));
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// Every method fails with an [`Error`](crate::Error):
/// - [`InvalidInput`](crate::Error::InvalidInput): the input breaks a limit. Nothing
///   was written.
/// - [`LeaseLost`](crate::Error::LeaseLost): the lease is no longer the key's live
///   lease (commit, renew, release).
/// - [`FingerprintMismatch`](crate::Error::FingerprintMismatch): a claim's fingerprint
///   differs from the stored one.
/// - [`Backend`](crate::Error::Backend): the storage failed. Check
///   [`Error::is_retryable`](crate::Error::is_retryable).
/// - [`SchemaTooNew`](crate::Error::SchemaTooNew),
///   [`SchemaNotMigrated`](crate::Error::SchemaNotMigrated),
///   [`Corrupt`](crate::Error::Corrupt), [`Unsupported`](crate::Error::Unsupported):
///   rarer, see each.
///
/// # Cancel safety
///
/// A dropped call may or may not have taken effect at the store. A single operation is
/// atomic: it did all or nothing. A batch may have done part of its items.
/// - A dropped `claim` may leave a live lease nobody holds. The key is claimable again
///   once that lease expires.
/// - A dropped `commit` may have committed. Commit is retry-safe: call it again with the
///   same lease.
/// - A dropped `release` or `renew` leaves the lease as it was, or released, or renewed.
///   Either way it expires by itself.
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
    /// Tries to become the one worker that processes `key`.
    ///
    /// Only [`Claim::Acquired`] means "process it now". A duplicate is an outcome,
    /// never an error: [`Claim::InFlight`] or [`Claim::Completed`].
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidInput`](crate::Error::InvalidInput): the lease is outside
    ///   [`MIN_LEASE`](crate::MIN_LEASE)..=[`MAX_LEASE`](crate::MAX_LEASE).
    /// - [`Error::FingerprintMismatch`](crate::Error::FingerprintMismatch): the key's
    ///   record holds another fingerprint.
    /// - [`Error::Backend`](crate::Error::Backend): the storage failed.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe. A claim dropped mid-flight may have acquired the key. Nobody
    /// holds that lease: the key waits until it expires.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use dedup_core::{Claim, ClaimOptions, DedupStore, Key, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dedup_core::Error> {
    /// let store = MemoryStore::new();
    /// let key = Key::new("billing", "order-42")?;
    /// let options = ClaimOptions::lease(Duration::from_secs(10));
    ///
    /// let first = store.claim(&key, &options).await?;
    /// assert_eq!(first.lease().map(|l| l.fence), Some(1));
    ///
    /// // A second worker finds the lease live.
    /// let second = store.claim(&key, &options).await?;
    /// assert!(matches!(second, Claim::InFlight { attempt: 1, .. }));
    /// # Ok(())
    /// # }
    /// ```
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim>;

    /// [`claim`](Self::claim) for each request, in order.
    ///
    /// It is one round trip where the backend can. At most
    /// [`MAX_BATCH_LEN`](crate::MAX_BATCH_LEN) requests.
    ///
    /// # Errors
    ///
    /// A fingerprint mismatch is that item's result. The whole call fails on invalid input
    /// ([`Error::InvalidInput`](crate::Error::InvalidInput), nothing written) or a storage
    /// failure ([`Error::Backend`](crate::Error::Backend)).
    ///
    /// # Cancel safety
    ///
    /// As [`claim`](Self::claim): a dropped batch may have acquired some or all keys.
    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>>;

    /// Extends a lease to expire `extend_by` from now.
    ///
    /// It works on a live lease, and on an expired one that nobody took over.
    ///
    /// # Errors
    ///
    /// - [`Error::LeaseLost`](crate::Error::LeaseLost): the key was taken over, completed
    ///   or purged. Stop the work.
    /// - [`Error::InvalidInput`](crate::Error::InvalidInput): `extend_by` is out of range.
    /// - [`Error::Backend`](crate::Error::Backend): the storage failed. The lease is as it
    ///   was; try again before it expires.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped renewal leaves the lease renewed or as it was.
    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease>;

    /// Marks the leased key processed.
    ///
    /// `outcome` is stored for duplicates to get back. It is at most
    /// [`MAX_OUTCOME_LEN`](crate::MAX_OUTCOME_LEN) bytes. Commit is retry-safe: a second
    /// commit by the same lease answers `Ok` and keeps the first outcome. An expired lease
    /// may still commit while nobody took it over.
    ///
    /// # Errors
    ///
    /// - [`Error::LeaseLost`](crate::Error::LeaseLost): another worker took the key over,
    ///   or it was completed by another lease or purged. Nothing changed.
    /// - [`Error::InvalidInput`](crate::Error::InvalidInput): the outcome is too long.
    /// - [`Error::Backend`](crate::Error::Backend): the storage failed. If it is
    ///   retryable, commit again.
    ///
    /// # Cancel safety
    ///
    /// A dropped commit may have committed. Call it again with the same lease to know.
    ///
    /// # Examples
    ///
    /// ```
    /// use dedup_core::{ClaimOptions, DedupStore, Key, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dedup_core::Error> {
    /// let store = MemoryStore::new();
    /// let key = Key::new("billing", "order-42")?;
    /// let claim = store.claim(&key, &ClaimOptions::default()).await?;
    /// let lease = claim.into_lease().expect("a new key is acquired");
    ///
    /// store.commit(&lease, None).await?;
    /// // Retry-safe: the same lease commits again.
    /// store.commit(&lease, None).await?;
    /// # Ok(())
    /// # }
    /// ```
    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()>;

    /// [`commit`](Self::commit) for each request, in order.
    ///
    /// It is one round trip where the backend can. At most
    /// [`MAX_BATCH_LEN`](crate::MAX_BATCH_LEN) requests.
    ///
    /// # Errors
    ///
    /// A lost lease is that item's result. The whole call fails on invalid input
    /// ([`Error::InvalidInput`](crate::Error::InvalidInput), nothing written) or a storage
    /// failure ([`Error::Backend`](crate::Error::Backend)).
    ///
    /// # Cancel safety
    ///
    /// As [`commit`](Self::commit): a dropped batch may have committed some or all items.
    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>>;

    /// Gives the key up after a failure, so the next delivery can retry at once.
    ///
    /// The fence and the attempt count stay. Releasing twice answers `Ok`.
    ///
    /// # Errors
    ///
    /// - [`Error::LeaseLost`](crate::Error::LeaseLost): the lease is no longer held.
    ///   Nothing changed.
    /// - [`Error::Backend`](crate::Error::Backend): the storage failed. The lease
    ///   expires by itself.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped release leaves the lease released or as it was. Either way
    /// it expires by itself.
    async fn release(&self, lease: &Lease) -> Result<()>;

    /// [`release`](Self::release), keeping `failure` on the record.
    ///
    /// `failure` says why this attempt failed. It becomes the record's
    /// [`Record::last_failure`], replacing the one it had. The [`Inbox`](crate::Inbox)
    /// does this after a failed attempt. An operator reads the cause with
    /// [`get`](Self::get) or `dedup inspect`.
    ///
    /// The cause stays through takeovers, renewals, plain releases and the commit. The
    /// next `release_failed` replaces it, or the record's removal drops it.
    ///
    /// # Errors
    ///
    /// - As [`release`](Self::release).
    /// - [`Error::InvalidInput`](crate::Error::InvalidInput): the failure does not fit
    ///   [`MAX_FAILURE_LEN`](crate::MAX_FAILURE_LEN) encoded ([`Failure::validate`]).
    ///   Nothing was written.
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Self::release).
    async fn release_failed(&self, lease: &Lease, failure: &Failure) -> Result<()>;

    /// The stored record of `key`, if any.
    ///
    /// Expired leases are included: compare their `expires_at` with the store's clock.
    ///
    /// # Errors
    ///
    /// [`Error::Backend`](crate::Error::Backend) when the storage fails;
    /// [`Error::Corrupt`](crate::Error::Corrupt) when the stored value is unreadable.
    ///
    /// # Examples
    ///
    /// ```
    /// use dedup_core::{DedupStore, Key, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dedup_core::Error> {
    /// let store = MemoryStore::new();
    /// let key = Key::new("billing", "order-42")?;
    /// assert!(store.get(&key).await?.is_none());
    /// # Ok(())
    /// # }
    /// ```
    async fn get(&self, key: &Key) -> Result<Option<Record>>;

    /// Removes records that can no longer matter, in batches.
    ///
    /// See [`PurgeOptions`] for what goes. Live leases never do. A purge that finishes is
    /// kept as the store's last run ([`Admin::last_purge`](crate::Admin::last_purge)).
    /// Failing to keep it is logged; it does not fail the purge.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for unusable options;
    /// [`Error::Backend`](crate::Error::Backend) when a batch fails. Earlier batches stay
    /// removed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: each batch is atomic. A dropped purge stops between or within a
    /// batch, leaving the records of unfinished batches in place.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use dedup_core::{DedupStore, MemoryStore, PurgeOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dedup_core::Error> {
    /// let store = MemoryStore::new();
    /// let week = Duration::from_secs(7 * 24 * 3600);
    /// let report = store.purge(&PurgeOptions::older_than(week)).await?;
    /// assert_eq!(report.total(), 0);
    /// # Ok(())
    /// # }
    /// ```
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
