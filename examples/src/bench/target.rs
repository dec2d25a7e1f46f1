//! What the bench needs of one backend: the store, a store on a manual clock for the
//! purge measure, and the raw driver baseline.

use std::sync::Arc;

use dedup_core::{DedupStore, ManualClock};
use futures::future::BoxFuture;

use super::Result;

/// The same work as the library's, issued raw through the backend's driver: the physical
/// limit of that backend at the bench's concurrency.
pub(crate) trait Raw: Send + Sync {
    /// The raw equivalent of claim then commit of one fresh key (two statements or
    /// commands, each its own transaction), by worker `worker` (`0..concurrency`).
    fn claim_commit(
        &self,
        worker: usize,
        consumer: Arc<str>,
        message_id: String,
    ) -> BoxFuture<'static, Result<()>>;

    /// The raw equivalent of `claim_many` then `commit_many` of fresh keys: one batched
    /// insert, then one batched update.
    fn batch(
        &self,
        worker: usize,
        consumer: Arc<str>,
        message_ids: Vec<String>,
    ) -> BoxFuture<'static, Result<()>>;

    /// Remove what the bench created (tables, keys), as far as the backend needs it.
    fn cleanup(&self) -> BoxFuture<'static, Result<()>>;
}

/// One backend under test.
pub(crate) struct Target {
    /// `sqlite`, `postgres`, `redis`, `redis-cluster`.
    pub(crate) backend: &'static str,
    /// The store as an application opens it (default clock), on names of its own.
    pub(crate) store: Arc<dyn DedupStore>,
    /// Another store of the same backend, on other names, running on `clock`.
    pub(crate) purge_store: Arc<dyn DedupStore>,
    /// The purge store's clock.
    pub(crate) clock: Arc<ManualClock>,
    /// The driver baseline.
    pub(crate) raw: Arc<dyn Raw>,
    /// How store and baseline are set up (printed as context).
    pub(crate) setup: String,
}
