//! [`Handle`]: the handler a consumer runs for each admitted delivery, in either inbox mode.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use dedup_core::{BoxError, DedupStore, Handled, Inbox, InboxError, Key, Lease};

use crate::Delivery;

/// What a consumer runs for a delivery it admitted: deduplicate by `key` and process.
///
/// The answer decides the broker action (see [`Action`](crate::Action)). Three ways to
/// get one:
/// - lease mode: [`with_inbox`] wraps an [`Inbox`] and a function of the lease and the
///   delivery;
/// - a transactional inbox: [`with_tx_inbox`](crate::with_tx_inbox) wraps
///   `dedup_postgres::TxInbox` or `dedup_mysql::TxInbox`, and a function of the open
///   transaction, the lease and the delivery;
/// - any closure `|key: Key, delivery: Delivery| async move { ... }` is a `Handle` as it
///   is. SQLite's `TxInbox`, whose handler is synchronous, is called that way.
///
/// # Examples
///
/// SQLite's transactional inbox behind a consumer, as a closure:
///
/// ```
/// use dedup_brokers::{Delivery, Handle};
/// use dedup_core::{BoxError, Handled, Key};
/// use dedup_sqlite::{SqliteStore, TxInbox};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let dir = tempfile::tempdir()?;
/// let inbox = TxInbox::new(SqliteStore::open(dir.path().join("app.db")).await?);
/// let handler = move |key: Key, delivery: Delivery| {
///     let inbox = inbox.clone();
///     async move {
///         inbox
///             .handle(&key, None, move |_tx, _lease| {
///                 // Write with `_tx`: the writes commit with the key's completion.
///                 Ok::<_, BoxError>(Some(delivery.payload.to_vec()))
///             })
///             .await
///     }
/// };
///
/// // What a consumer does with each delivery it admitted:
/// let key = Key::new("billing", "order-42")?;
/// let delivery = Delivery {
///     message_id: Some("order-42".into()),
///     payload: bytes::Bytes::from_static(b"{}"),
///     headers: Vec::new(),
///     published_at: None,
///     redelivered: false,
///     broker_ref: "1".into(),
/// };
/// assert!(matches!(handler.handle(&key, &delivery).await?, Handled::Processed { .. }));
/// assert!(matches!(handler.handle(&key, &delivery).await?, Handled::Duplicate { .. }));
/// # Ok(())
/// # }
/// ```
#[async_trait]
pub trait Handle: Send + Sync + 'static {
    /// Process `delivery` at most once under `key` (consumer name and message id).
    async fn handle(&self, key: &Key, delivery: &Delivery) -> Result<Handled, InboxError>;
}

#[async_trait]
impl<F, Fut> Handle for F
where
    F: Fn(Key, Delivery) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Handled, InboxError>> + Send,
{
    async fn handle(&self, key: &Key, delivery: &Delivery) -> Result<Handled, InboxError> {
        (self)(key.clone(), delivery.clone()).await
    }
}

#[async_trait]
impl<H: Handle + ?Sized> Handle for Arc<H> {
    async fn handle(&self, key: &Key, delivery: &Delivery) -> Result<Handled, InboxError> {
        (**self).handle(key, delivery).await
    }
}

/// A [`Handle`] that runs `work` under an [`Inbox`] (lease mode): see [`with_inbox`].
pub struct InboxHandler<S: ?Sized, F> {
    inbox: Inbox<S>,
    work: F,
}

impl<S: ?Sized, F> std::fmt::Debug for InboxHandler<S, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboxHandler").finish_non_exhaustive()
    }
}

/// A handler running `work(lease, delivery)` through `inbox.handle`, with no fingerprint.
///
/// The outcome `work` returns is stored for duplicates. Its error releases the lease, or
/// is stored, per the inbox's [`FailurePolicy`](dedup_core::FailurePolicy). An error
/// marked [`Transient`](dedup_core::Transient) runs `work` again within the same
/// delivery, as a new attempt. The inbox's
/// [`handler_retry`](dedup_core::InboxConfig::handler_retry) says how often. Then the
/// delivery goes back to the broker.
///
/// # Examples
///
/// ```
/// use dedup_brokers::{Delivery, Handle, with_inbox};
/// use dedup_core::{BoxError, Handled, Inbox, Key, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let handler = with_inbox(Inbox::new(MemoryStore::new()), |_lease, delivery: Delivery| async move {
///     Ok::<_, BoxError>(Some(delivery.payload.to_vec()))
/// });
///
/// // What a consumer does with each delivery it admitted:
/// let key = Key::new("billing", "order-42")?;
/// let delivery = Delivery {
///     message_id: Some("order-42".into()),
///     payload: bytes::Bytes::from_static(b"{}"),
///     headers: Vec::new(),
///     published_at: None,
///     redelivered: false,
///     broker_ref: "1".into(),
/// };
/// assert!(matches!(handler.handle(&key, &delivery).await?, Handled::Processed { .. }));
/// assert!(matches!(handler.handle(&key, &delivery).await?, Handled::Duplicate { .. }));
/// # Ok(())
/// # }
/// ```
pub fn with_inbox<S, F, Fut, E>(inbox: Inbox<S>, work: F) -> InboxHandler<S, F>
where
    S: DedupStore + ?Sized + 'static,
    F: Fn(Lease, Delivery) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<Vec<u8>>, E>> + Send,
    E: Into<BoxError> + Send,
{
    InboxHandler { inbox, work }
}

#[async_trait]
impl<S, F, Fut, E> Handle for InboxHandler<S, F>
where
    S: DedupStore + ?Sized + 'static,
    F: Fn(Lease, Delivery) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<Vec<u8>>, E>> + Send,
    E: Into<BoxError> + Send,
{
    async fn handle(&self, key: &Key, delivery: &Delivery) -> Result<Handled, InboxError> {
        self.inbox
            .handle(key, None, |lease| (self.work)(lease, delivery.clone()))
            .await
    }
}
