//! What the bench needs of one backend: the store, a store on a manual clock for the
//! purge measure, the raw driver baseline, and (SQL backends) the transactional mode.

use std::sync::Arc;

use std::future::Future;

use dedup_core::{Claim, ClaimOptions, DedupStore, Key, Lease, ManualClock};
use futures::future::BoxFuture;

use super::Result;

/// The same work as the library's, issued raw through the backend's driver: the physical
/// limit of that backend at the bench's concurrency.
pub(crate) trait Raw: Send + Sync {
    /// The raw equivalent of claim then commit of one key (two statements or commands,
    /// each its own transaction), by worker `worker` (`0..concurrency`): an insert that
    /// does nothing when the key exists, then, only if it inserted, the update. `true`
    /// when it inserted (a fresh key), `false` for a duplicate (nothing updated).
    fn claim_commit(
        &self,
        worker: usize,
        consumer: Arc<str>,
        message_id: String,
    ) -> BoxFuture<'static, Result<bool>>;

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

/// The ways of processing a message inside a database transaction that the
/// transactional measures compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TxFlavor {
    /// The library: one transaction holding the store's `claim_in_tx` and the business
    /// insert.
    Library,
    /// The business insert alone in its transaction: no deduplication at all.
    BusinessOnly,
    /// The MassTransit-style inbox: one transaction inserts the inbox row (or locks it
    /// if present) and commits; a second locks it again, checks it is not consumed, does
    /// the business insert, marks the row consumed and commits.
    TwoTransactions,
    /// The library's transactional inbox (`TxInbox`): the attempt-counting lease-mode
    /// claim committed first, then one transaction holding the business insert and the
    /// key's completion.
    Inbox,
    /// `TxInbox` with the claim committed as the store's own lease-mode claim commits
    /// (PostgreSQL: `with_durable_claims`; the other backends' `TxInbox` already does): the
    /// same statements and commits as [`HandWritten`](Self::HandWritten).
    InboxAsHandWritten,
    /// `TxInbox`'s steps written by hand with the public API: the store's lease-mode
    /// `claim`, then one transaction holding the business insert and `commit_in_tx`. What
    /// the wrapper itself costs is the gap between this and `InboxAsHandWritten`.
    HandWritten,
    /// The business insert and one message through the store's outbox (`enqueue`) in one
    /// transaction: what the outbox adds to [`BusinessOnly`](Self::BusinessOnly). Made
    /// by the counted mode only.
    #[cfg_attr(not(feature = "counted"), allow(dead_code))]
    Enqueue,
}

/// The message an [`TxFlavor::Enqueue`] producer writes with its business row.
/// Used by the SQL backends only.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) fn outbox_message(id: &str) -> Result<dedup_core::outbox::OutboxMessage> {
    Ok(dedup_core::outbox::OutboxMessage::new(
        "/nowhere",
        id,
        br#"{"order_id":"o-1","item":"book","amount":100}"#.to_vec(),
    )?
    .header("type", "OrderPlaced")?)
}

/// The [`TxFlavor::HandWritten`] steps around the backend's transaction: the store's
/// lease-mode claim of `key`; if acquired, `in_tx` (the transaction holding the business
/// insert and `commit_in_tx` under the lease), and a release of the lease if it failed.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) async fn hand_written<Fut>(
    store: &dyn DedupStore,
    key: &Key,
    in_tx: impl FnOnce(Lease) -> Fut,
) -> Result<()>
where
    Fut: Future<Output = Result<()>>,
{
    let Claim::Acquired(lease) = store.claim(key, &ClaimOptions::default()).await? else {
        return Ok(());
    };
    let done = in_tx(lease.clone()).await;
    if done.is_err() {
        let _ = store.release(&lease).await;
    }
    done
}

/// Processing a message inside a transaction: the library's transactional claim against
/// the business write alone and against the two-transaction inbox (SQL backends only).
pub(crate) trait Transactional: Send + Sync {
    /// Process message `message_id` of `consumer` the `flavor` way, by worker `worker`:
    /// a business row is inserted for a message seen first, nothing for a duplicate.
    fn process(
        &self,
        flavor: TxFlavor,
        worker: usize,
        consumer: Arc<str>,
        message_id: String,
    ) -> BoxFuture<'static, Result<()>>;
}

/// One backend under test.
pub(crate) struct Target {
    /// `sqlite`, `postgres` (durable settings), `postgres-nosync`, `mysql`, `galera`,
    /// `redis`, `redis-cluster`, `valkey`, `valkey-cluster`, `nats-kv` (R1),
    /// `nats-kv-r3`.
    pub(crate) backend: &'static str,
    /// The store as an application opens it (default clock), on names of its own.
    pub(crate) store: Arc<dyn DedupStore>,
    /// Another store of the same backend, on other names, running on `clock`.
    pub(crate) purge_store: Arc<dyn DedupStore>,
    /// The purge store's clock.
    pub(crate) clock: Arc<ManualClock>,
    /// The driver baseline.
    pub(crate) raw: Arc<dyn Raw>,
    /// The transactional mode, where the backend has one.
    pub(crate) tx: Option<Arc<dyn Transactional>>,
    /// How store and baseline are set up (printed as context).
    pub(crate) setup: String,
}
