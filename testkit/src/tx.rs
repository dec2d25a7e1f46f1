//! Transactional-mode consumers: an application's handler under the SQLite, PostgreSQL or
//! MySQL / MariaDB `TxInbox` (the last two through one sqlx consumer, [`sqlx_tx`]).
//!
//! The `TxInbox` claims through its own store (not the kit's stopping view), so the kit
//! adds its stopping points around it: before the claim, inside the transaction (the
//! handler's effects and probes, then after the handler and before the transaction's
//! commit), and before the ack. A kill inside the transaction makes the handler return the
//! kit's error: the transaction rolls back, as a dead process's would. The `TxInbox` then
//! releases the lease (a dead process would leave it to run out), so the next delivery
//! takes the key over at once instead of after the next expiry: the same states, reached
//! sooner.

#[cfg(feature = "sqlite")]
pub use self::sqlite::{SqliteTx, sqlite_tx};

#[cfg(feature = "mysql")]
pub use self::mysql::{MySqlTx, mysql_tx};
#[cfg(feature = "postgres")]
pub use self::postgres::{PostgresTx, postgres_tx};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use self::sqlx_tx::{SqlxTx, sqlx_tx};

/// Run `handled` through `cx`: tell the kit about a committed transaction, then settle.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
async fn settle(
    cx: &crate::Cx,
    handled: Result<dedup_core::Handled, dedup_core::InboxError>,
) -> Result<(), dedup_core::BoxError> {
    if let Ok(dedup_core::Handled::Processed { .. }) = handled {
        cx.committed_in_tx();
    }
    cx.settle(&handled).await?;
    Ok(())
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use std::sync::Arc;

    use dedup_core::{BoxError, InboxConfig, Lease};
    use dedup_sqlite::TxInbox;
    use dedup_sqlite::rusqlite::Transaction;
    use futures::future::BoxFuture;

    use crate::consumer::{Consumer, Cx, Effects, Message, Mode};
    use crate::world::Point;

    /// A transactional consumer on SQLite: each delivery runs `handler` under
    /// [`TxInbox::handle`], inside the transaction that completes the key. `handler` gets
    /// the transaction, the lease, the message and the [`Effects`] ledger (call its
    /// `_blocking` methods: the handler runs on a blocking thread). Build `inbox` from the
    /// store you return in [`Subject`](crate::Subject); the kit applies its inbox
    /// configuration to it.
    ///
    /// Stopping points: before the claim, at each [`Effects`] call or probe inside the
    /// transaction, after the handler and before the transaction's commit, before the
    /// ack. A kill inside the transaction rolls it back; the `TxInbox` then releases the
    /// lease (it claims on its own store, which the kit does not stop), where a crashed
    /// process would leave it to run out: the next delivery takes the key over at once.
    pub fn sqlite_tx<H>(inbox: TxInbox, handler: H) -> SqliteTx<H>
    where
        H: Fn(&Transaction<'_>, &Lease, &Message, &Effects) -> Result<Option<Vec<u8>>, BoxError>
            + Send
            + Sync
            + 'static,
    {
        SqliteTx {
            inbox,
            handler: Arc::new(handler),
        }
    }

    /// The consumer [`sqlite_tx`] builds.
    pub struct SqliteTx<H> {
        inbox: TxInbox,
        handler: Arc<H>,
    }

    impl<H> std::fmt::Debug for SqliteTx<H> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("SqliteTx")
                .field("inbox", &self.inbox)
                .finish_non_exhaustive()
        }
    }

    impl<H> Consumer for SqliteTx<H>
    where
        H: Fn(&Transaction<'_>, &Lease, &Message, &Effects) -> Result<Option<Vec<u8>>, BoxError>
            + Send
            + Sync
            + 'static,
    {
        fn mode(&self) -> Mode {
            Mode::Tx
        }

        fn configure(&mut self, config: &InboxConfig) {
            self.inbox = self.inbox.clone().with_config(config.clone());
        }

        fn consume(&self, cx: Cx) -> BoxFuture<'static, Result<(), BoxError>> {
            let (inbox, handler) = (self.inbox.clone(), Arc::clone(&self.handler));
            Box::pin(async move {
                cx.stop(Point::Claim).await?;
                cx.tell(&format!(
                    "hands {} to the TxInbox (claim)",
                    cx.message().name()
                ));
                let (message, fx) = (cx.message().clone(), cx.effects());
                let inner = fx.clone();
                let handled = inbox
                    .handle(&cx.key(), None, move |tx, lease| {
                        inner.enter_tx(lease);
                        let out = (*handler)(tx, lease, &message, &inner)?;
                        inner.before_tx_commit_blocking()?;
                        Ok::<_, BoxError>(out)
                    })
                    .await;
                fx.leave_tx();
                super::settle(&cx, handled).await
            })
        }
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
mod sqlx_tx {
    use std::sync::Arc;

    use dedup_core::{BoxError, InboxConfig, Lease, TxHandle};
    use dedup_sql::tx_inbox::{Conn, TxInbox, TxStore};
    use futures::future::BoxFuture;

    use crate::consumer::{Consumer, Cx, Effects, Message, Mode};
    use crate::world::Point;

    /// A transactional consumer on a sqlx backend (PostgreSQL, MySQL / MariaDB): each
    /// delivery runs `handler` under [`TxInbox::handle`], inside the transaction that
    /// completes the key. `handler` gets the transaction's connection, the lease, the
    /// message and the [`Effects`] ledger. Build `inbox` from the store you return in
    /// [`Subject`](crate::Subject); the kit applies its inbox configuration to it.
    /// Stopping points and kills as for `sqlite_tx`. [`postgres_tx`](crate::postgres_tx)
    /// and [`mysql_tx`](crate::mysql_tx) name it per backend.
    ///
    /// The kit calls the inbox through [`TxHandle::handle_tx`], the entry point a broker
    /// consumer's `dedup_brokers::with_tx_inbox` calls: what the kit checks is the
    /// production path. Build `inbox` as your service does: an inbox
    /// [`with_begin`](TxInbox::with_begin) (your pool, or your closure that begins the
    /// transaction) is checked with your transactions, begun, committed, rolled back and
    /// retried on conflicts by the inbox.
    pub fn sqlx_tx<S, H>(inbox: TxInbox<S>, handler: H) -> SqlxTx<S, H>
    where
        S: TxStore,
        H: for<'c> Fn(
                &'c mut Conn<S>,
                &'c Lease,
                &'c Message,
                &'c Effects,
            ) -> BoxFuture<'c, Result<Option<Vec<u8>>, BoxError>>
            + Send
            + Sync
            + 'static,
    {
        SqlxTx {
            inbox,
            handler: Arc::new(handler),
        }
    }

    /// The consumer [`sqlx_tx`] builds.
    pub struct SqlxTx<S: TxStore, H> {
        inbox: TxInbox<S>,
        handler: Arc<H>,
    }

    impl<S: TxStore, H> std::fmt::Debug for SqlxTx<S, H> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("SqlxTx")
                .field("inbox", &self.inbox)
                .finish_non_exhaustive()
        }
    }

    impl<S, H> Consumer for SqlxTx<S, H>
    where
        S: TxStore,
        Conn<S>: Send,
        H: for<'c> Fn(
                &'c mut Conn<S>,
                &'c Lease,
                &'c Message,
                &'c Effects,
            ) -> BoxFuture<'c, Result<Option<Vec<u8>>, BoxError>>
            + Send
            + Sync
            + 'static,
    {
        fn mode(&self) -> Mode {
            Mode::Tx
        }

        fn configure(&mut self, config: &InboxConfig) {
            self.inbox = self.inbox.clone().with_config(config.clone());
        }

        fn consume(&self, cx: Cx) -> BoxFuture<'static, Result<(), BoxError>> {
            let (inbox, handler) = (self.inbox.clone(), Arc::clone(&self.handler));
            Box::pin(async move {
                cx.stop(Point::Claim).await?;
                cx.tell(&format!(
                    "hands {} to the TxInbox (claim)",
                    cx.message().name()
                ));
                let (message, fx, key) = (cx.message().clone(), cx.effects(), cx.key());
                let handled = TxHandle::handle_tx(&inbox, &key, None, |conn, lease| {
                    let (handler, message, fx) =
                        (Arc::clone(&handler), message.clone(), fx.clone());
                    Box::pin(async move {
                        fx.enter_tx(lease);
                        let out = (*handler)(conn, lease, &message, &fx).await?;
                        fx.before_tx_commit().await?;
                        Ok::<_, BoxError>(out)
                    })
                })
                .await;
                fx.leave_tx();
                super::settle(&cx, handled).await
            })
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use dedup_core::{BoxError, Lease};
    use dedup_postgres::sqlx::PgConnection;
    use dedup_postgres::{PostgresStore, TxInbox};
    use futures::future::BoxFuture;

    use super::sqlx_tx::{SqlxTx, sqlx_tx};
    use crate::consumer::{Effects, Message};

    /// A transactional consumer on PostgreSQL: [`sqlx_tx`](crate::sqlx_tx) over a
    /// PostgreSQL [`TxInbox`]; `handler` gets the transaction's `&mut PgConnection`.
    pub fn postgres_tx<H>(inbox: TxInbox, handler: H) -> PostgresTx<H>
    where
        H: for<'c> Fn(
                &'c mut PgConnection,
                &'c Lease,
                &'c Message,
                &'c Effects,
            ) -> BoxFuture<'c, Result<Option<Vec<u8>>, BoxError>>
            + Send
            + Sync
            + 'static,
    {
        sqlx_tx(inbox, handler)
    }

    /// The consumer [`postgres_tx`] builds.
    pub type PostgresTx<H> = SqlxTx<PostgresStore, H>;
}

#[cfg(feature = "mysql")]
mod mysql {
    use dedup_core::{BoxError, Lease};
    use dedup_mysql::sqlx::MySqlConnection;
    use dedup_mysql::{MySqlStore, TxInbox};
    use futures::future::BoxFuture;

    use super::sqlx_tx::{SqlxTx, sqlx_tx};
    use crate::consumer::{Effects, Message};

    /// A transactional consumer on MySQL / MariaDB: [`sqlx_tx`](crate::sqlx_tx) over a
    /// MySQL [`TxInbox`]; `handler` gets the transaction's `&mut MySqlConnection`.
    pub fn mysql_tx<H>(inbox: TxInbox, handler: H) -> MySqlTx<H>
    where
        H: for<'c> Fn(
                &'c mut MySqlConnection,
                &'c Lease,
                &'c Message,
                &'c Effects,
            ) -> BoxFuture<'c, Result<Option<Vec<u8>>, BoxError>>
            + Send
            + Sync
            + 'static,
    {
        sqlx_tx(inbox, handler)
    }

    /// The consumer [`mysql_tx`] builds.
    pub type MySqlTx<H> = SqlxTx<MySqlStore, H>;
}
