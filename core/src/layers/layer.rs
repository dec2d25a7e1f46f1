//! [`StoreLayer`], what a layer adds around a store, and [`Layered`], a store with a layer
//! around it.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;

use crate::store::ItemResult;
use crate::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Failure, Key,
    Lease, PurgeOptions, PurgeReport, Record, Result,
};

/// What a layer adds around the store it wraps.
///
/// Implement it and wrap a store in [`Layered`]: the pair is a [`DedupStore`]. Each method
/// gets the wrapped store as `inner`. Override only the operations your layer changes: the
/// others call `inner`'s method of the same name.
///
/// # Contract
///
/// - Every operation without an override runs through [`around`](Self::around), once,
///   with its name. Override `around` for what applies to every operation alike (as
///   [`Retry`](super::Retry) does). By default it calls the operation once.
/// - A default calls the same method of `inner`. `claim_many` calls `inner.claim_many`,
///   never `claim` per item, so a batch stays one round trip. A layer that changes claims
///   must override `claim` and `claim_many`. The same goes for `commit` and `commit_many`,
///   and for `release` and `release_failed`.
/// - [`capabilities`](Self::capabilities) answers `inner`'s. A layer changes it only when it
///   changes what the store does.
/// - A layer keeps the [`DedupStore`] contract. It may retry, observe, delay or refuse an
///   operation. It must not answer for the store (a claim it did not pass on is never
///   `Acquired`).
///
/// The methods return `impl Future + Send`: write them as `async fn`. Only the
/// [`Layered`] store boxes its future, as any `DedupStore` does, so a layer costs one
/// allocation per call whatever it overrides.
///
/// # Examples
///
/// A layer that counts claims and leaves every other operation alone:
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use dedup_core::layers::{Layered, StoreLayer};
/// use dedup_core::{Claim, ClaimOptions, DedupStore, Key, MemoryStore, Result};
///
/// #[derive(Default)]
/// struct CountClaims(AtomicU64);
///
/// impl<S: DedupStore> StoreLayer<S> for CountClaims {
///     async fn claim(&self, inner: &S, key: &Key, options: &ClaimOptions) -> Result<Claim> {
///         self.0.fetch_add(1, Ordering::Relaxed);
///         inner.claim(key, options).await
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<()> {
/// let store = Layered::wrap(MemoryStore::new(), CountClaims::default());
/// let key = Key::new("billing", "order-42")?;
/// let lease = store.claim(&key, &ClaimOptions::default()).await?;
/// store.commit(&lease.into_lease().unwrap(), None).await?;
/// assert_eq!(store.layer().0.load(Ordering::Relaxed), 1);
/// # Ok(())
/// # }
/// ```
pub trait StoreLayer<S: DedupStore>: Send + Sync {
    /// Runs one operation: `call` starts it on the wrapped store, and may be called again.
    ///
    /// `op` names the operation: `claim`, `claim_many`, `renew`, `commit`, `commit_many`,
    /// `release`, `release_failed`, `get` or `purge`. The default calls `call` once.
    fn around<T, F, Fut>(&self, op: &'static str, call: F) -> impl Future<Output = Result<T>> + Send
    where
        T: Send,
        F: FnMut() -> Fut + Send,
        Fut: Future<Output = Result<T>> + Send,
    {
        let _ = op;
        let mut call = call;
        async move { call().await }
    }

    /// [`DedupStore::claim`] on `inner`.
    fn claim(
        &self,
        inner: &S,
        key: &Key,
        options: &ClaimOptions,
    ) -> impl Future<Output = Result<Claim>> + Send {
        async move {
            self.around("claim", move || inner.claim(key, options))
                .await
        }
    }

    /// [`DedupStore::claim_many`] on `inner`.
    fn claim_many(
        &self,
        inner: &S,
        requests: &[ClaimRequest],
    ) -> impl Future<Output = Result<Vec<ItemResult<Claim>>>> + Send {
        async move {
            self.around("claim_many", move || inner.claim_many(requests))
                .await
        }
    }

    /// [`DedupStore::renew`] on `inner`.
    fn renew(
        &self,
        inner: &S,
        lease: &Lease,
        extend_by: Duration,
    ) -> impl Future<Output = Result<Lease>> + Send {
        async move {
            self.around("renew", move || inner.renew(lease, extend_by))
                .await
        }
    }

    /// [`DedupStore::commit`] on `inner`.
    fn commit(
        &self,
        inner: &S,
        lease: &Lease,
        outcome: Option<&[u8]>,
    ) -> impl Future<Output = Result<()>> + Send {
        async move {
            self.around("commit", move || inner.commit(lease, outcome))
                .await
        }
    }

    /// [`DedupStore::commit_many`] on `inner`.
    fn commit_many(
        &self,
        inner: &S,
        requests: &[CommitRequest],
    ) -> impl Future<Output = Result<Vec<ItemResult<()>>>> + Send {
        async move {
            self.around("commit_many", move || inner.commit_many(requests))
                .await
        }
    }

    /// [`DedupStore::release`] on `inner`.
    fn release(&self, inner: &S, lease: &Lease) -> impl Future<Output = Result<()>> + Send {
        async move { self.around("release", move || inner.release(lease)).await }
    }

    /// [`DedupStore::release_failed`] on `inner`.
    fn release_failed(
        &self,
        inner: &S,
        lease: &Lease,
        failure: &Failure,
    ) -> impl Future<Output = Result<()>> + Send {
        async move {
            self.around("release_failed", move || {
                inner.release_failed(lease, failure)
            })
            .await
        }
    }

    /// [`DedupStore::get`] on `inner`.
    fn get(&self, inner: &S, key: &Key) -> impl Future<Output = Result<Option<Record>>> + Send {
        async move { self.around("get", move || inner.get(key)).await }
    }

    /// [`DedupStore::purge`] on `inner`.
    fn purge(
        &self,
        inner: &S,
        options: &PurgeOptions,
    ) -> impl Future<Output = Result<PurgeReport>> + Send {
        async move { self.around("purge", move || inner.purge(options)).await }
    }

    /// [`DedupStore::capabilities`] of `inner`.
    fn capabilities(&self, inner: &S) -> Capabilities {
        inner.capabilities()
    }
}

/// A store with a layer around it: a [`DedupStore`] that runs each operation through the
/// layer's [`StoreLayer`] method.
///
/// [`Retry`](super::Retry) and [`Observed`](super::Observed) are `Layered` stores. Stack
/// layers by wrapping a `Layered` store again: the outermost layer sees each call first.
#[derive(Clone, Debug)]
pub struct Layered<L, S> {
    layer: L,
    inner: S,
}

impl<L, S> Layered<L, S> {
    /// Wrap `inner` in `layer`.
    pub fn wrap(inner: S, layer: L) -> Self {
        Layered { layer, inner }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The layer.
    pub fn layer(&self) -> &L {
        &self.layer
    }
}

#[async_trait]
impl<L: StoreLayer<S>, S: DedupStore> DedupStore for Layered<L, S> {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        self.layer.claim(&self.inner, key, options).await
    }
    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        self.layer.claim_many(&self.inner, requests).await
    }
    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        self.layer.renew(&self.inner, lease, extend_by).await
    }
    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        self.layer.commit(&self.inner, lease, outcome).await
    }
    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        self.layer.commit_many(&self.inner, requests).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.layer.release(&self.inner, lease).await
    }
    async fn release_failed(&self, lease: &Lease, failure: &Failure) -> Result<()> {
        self.layer.release_failed(&self.inner, lease, failure).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        self.layer.get(&self.inner, key).await
    }
    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        self.layer.purge(&self.inner, options).await
    }
    fn capabilities(&self) -> Capabilities {
        self.layer.capabilities(&self.inner)
    }
}
