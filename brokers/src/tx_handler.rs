//! [`with_tx_inbox`]: a broker handler over a transactional inbox ([`TxHandle`]).

use std::sync::Arc;

use async_trait::async_trait;
use dedup_core::{BoxError, Handled, InboxError, Key, Lease, TxHandle};
use futures::future::BoxFuture;

use crate::{Delivery, Handle};

/// A [`Handle`] that runs `work` in a transactional inbox's transaction: see
/// [`with_tx_inbox`].
pub struct TxInboxHandler<I, F> {
    inbox: I,
    work: Arc<F>,
}

impl<I, F> std::fmt::Debug for TxInboxHandler<I, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxInboxHandler").finish_non_exhaustive()
    }
}

/// A handler running `work(conn, lease, delivery)` through a transactional inbox's
/// [`handle_tx`](TxHandle::handle_tx) (no fingerprint): `dedup_postgres::TxInbox` or
/// `dedup_mysql::TxInbox`. `work` runs its statements on `&mut *conn`, the open
/// transaction; those writes and the key's completion commit together, so a duplicate
/// delivery finds the key done and `work` never ran twice to effect. The outcome `work`
/// returns is stored for duplicates; its error rolls the transaction back and releases the
/// key (or stores the failure, per the inbox's
/// [`FailurePolicy`](dedup_core::FailurePolicy)). `work` may run more than once for one
/// delivery (a transaction the database asked to run again, a
/// [`Transient`](dedup_core::Transient) error), each time in a fresh transaction with its
/// own copy of the delivery.
///
/// A deadlock or a serialization failure runs `work` again in a fresh transaction under
/// the same lease, without using an attempt; when the inbox's retries run out, the
/// answer is [`InboxError::Conflict`] and the broker redelivers (see the backend's
/// `TxInbox`). The transaction commits only when `work` succeeded.
///
/// To run `work` in your own transactions (your pool, an isolation level you set), build
/// the inbox with `TxInbox::with_begin`: no glue around `handle_in` is needed, and begin
/// and commit errors are the inbox's to convert:
///
/// ```no_run
/// # async fn demo(store: dedup_postgres::PostgresStore, pool: dedup_postgres::sqlx::PgPool) {
/// use dedup_brokers::{Delivery, with_tx_inbox};
/// use dedup_core::Lease;
/// use dedup_postgres::sqlx;
/// let handler = with_tx_inbox(
///     dedup_postgres::TxInbox::new(store).with_begin(pool),
///     |conn: &mut sqlx::PgConnection, _lease: &Lease, delivery: Delivery| {
///         Box::pin(async move {
///             sqlx::query("INSERT INTO shipments (body) VALUES ($1)")
///                 .bind(delivery.payload.to_vec())
///                 .execute(&mut *conn)
///                 .await?;
///             Ok::<_, sqlx::Error>(None)
///         })
///     },
/// );
/// # let _ = handler;
/// # }
/// ```
///
/// ```no_run
/// # async fn demo(store: dedup_postgres::PostgresStore) {
/// use dedup_brokers::{Delivery, with_tx_inbox};
/// use dedup_core::Lease;
/// let handler = with_tx_inbox(
///     dedup_postgres::TxInbox::new(store),
///     |conn: &mut dedup_postgres::sqlx::PgConnection, _lease: &Lease, delivery: Delivery| {
///         Box::pin(async move {
///             dedup_postgres::sqlx::query("INSERT INTO invoices (body) VALUES ($1)")
///                 .bind(delivery.payload.to_vec())
///                 .execute(&mut *conn)
///                 .await?;
///             Ok::<_, dedup_postgres::sqlx::Error>(None)
///         })
///     },
/// );
/// # let _ = handler;
/// # }
/// ```
pub fn with_tx_inbox<I, F, E>(inbox: I, work: F) -> TxInboxHandler<I, F>
where
    I: TxHandle,
    F: for<'c> Fn(
            &'c mut I::Conn,
            &'c Lease,
            Delivery,
        ) -> BoxFuture<'c, Result<Option<Vec<u8>>, E>>
        + Send
        + Sync
        + 'static,
    E: Into<BoxError> + Send + 'static,
{
    TxInboxHandler {
        inbox,
        work: Arc::new(work),
    }
}

#[async_trait]
impl<I, F, E> Handle for TxInboxHandler<I, F>
where
    I: TxHandle,
    F: for<'c> Fn(
            &'c mut I::Conn,
            &'c Lease,
            Delivery,
        ) -> BoxFuture<'c, Result<Option<Vec<u8>>, E>>
        + Send
        + Sync
        + 'static,
    E: Into<BoxError> + Send + 'static,
{
    async fn handle(&self, key: &Key, delivery: &Delivery) -> Result<Handled, InboxError> {
        let work = Arc::clone(&self.work);
        let delivery = delivery.clone();
        self.inbox
            .handle_tx(key, None, move |conn, lease| {
                work(conn, lease, delivery.clone())
            })
            .await
    }
}
