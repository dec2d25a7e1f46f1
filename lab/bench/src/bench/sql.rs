//! The raw baseline and the transactional mode of the SQL servers (PostgreSQL, MySQL /
//! MariaDB), written once. Each backend gives its [`Statements`]: its tables, its SQL and
//! how it binds it. The order of the statements, their transactions and their connections
//! is here, so the two baselines differ by their SQL alone.

use std::sync::Arc;

use dedup_core::outbox::OutboxMessage;
use dedup_core::{BoxError, DedupStore, Key, TxClaim};
use dedup_sql::tx_inbox::Conn;
use dedup_sql::{SqlBackend, TxInbox, TxStore};
use futures::FutureExt;
use futures::future::BoxFuture;

use super::Result;
use super::target::{Raw, Transactional, TxFlavor, hand_written, outbox_message};

/// The sqlx database of store `S`.
type Db<S> = <<S as TxStore>::Backend as SqlBackend>::Db;

/// One SQL backend's raw statements, each run on a connection the caller gives.
pub(super) trait Statements: Send + Sync + 'static {
    /// The backend's store.
    type Store: TxStore + DedupStore + InTx;

    /// Whether the two-transaction inbox inserts its row before it locks it. MySQL does:
    /// a locking read of an absent row at REPEATABLE READ takes a gap lock, and two such
    /// transactions on neighbouring keys deadlock on their inserts.
    const INSERT_BEFORE_LOCK: bool;

    /// The baseline's pool, built with the store's pool options.
    fn pool(&self) -> &sqlx::Pool<Db<Self::Store>>;

    /// Run `statement` for one key on `conn`: the rows it changed.
    fn execute<'a>(
        &'a self,
        conn: &'a mut Conn<Self::Store>,
        statement: Statement,
        consumer: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<u64>>;

    /// Lock the key's raw row: whether it is consumed (`None`: no row).
    fn lock_row<'a>(
        &'a self,
        conn: &'a mut Conn<Self::Store>,
        consumer: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<bool>>>;

    /// The raw claim then commit of fresh keys: one batched insert, one batched update.
    fn batch<'a>(&'a self, consumer: &'a str, ids: &'a [String]) -> BoxFuture<'a, Result<()>>;

    /// Drop the bench's tables (and undo what else the backend set up).
    fn cleanup(&self) -> BoxFuture<'_, Result<()>>;
}

/// What the transactional flavors call on a store beyond [`TxStore`]: its own methods,
/// alike on both backends.
pub(super) trait InTx: TxStore {
    /// The store's claim inside the open transaction `conn`.
    fn claim_in_tx<'a>(
        &'a self,
        conn: &'a mut Conn<Self>,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<TxClaim>>;

    /// One message through the store's outbox, inside the open transaction `conn`.
    fn enqueue<'a>(
        &'a self,
        conn: &'a mut Conn<Self>,
        message: &'a OutboxMessage,
    ) -> BoxFuture<'a, Result<()>>;
}

/// [`InTx`] for a store whose inherent `claim_in_tx` and `outbox` have the shape both
/// SQL stores share.
macro_rules! in_tx {
    ($store:ty) => {
        impl InTx for $store {
            fn claim_in_tx<'a>(
                &'a self,
                conn: &'a mut Conn<Self>,
                key: &'a Key,
            ) -> BoxFuture<'a, Result<TxClaim>> {
                async move { Ok(<$store>::claim_in_tx(self, conn, key, None).await?) }.boxed()
            }

            fn enqueue<'a>(
                &'a self,
                conn: &'a mut Conn<Self>,
                message: &'a OutboxMessage,
            ) -> BoxFuture<'a, Result<()>> {
                let outbox = self.outbox();
                async move {
                    outbox.enqueue(conn, std::slice::from_ref(message)).await?;
                    Ok(())
                }
                .boxed()
            }
        }
    };
}

#[cfg(feature = "postgres")]
in_tx!(dedup_postgres::PostgresStore);
#[cfg(feature = "mysql")]
in_tx!(dedup_mysql::MySqlStore);

/// A raw statement of one key.
#[derive(Clone, Copy, Debug)]
pub(super) enum Statement {
    /// The claim: an insert that does nothing when the key exists.
    Claim,
    /// The commit: the key's row marked processed.
    Commit,
    /// The application's own insert beside it.
    Business,
}

/// The raw claim of one key on `conn`: `true` when it inserted.
async fn try_insert<B: Statements>(
    raw: &B,
    conn: &mut Conn<B::Store>,
    consumer: &str,
    id: &str,
) -> Result<bool> {
    Ok(raw.execute(conn, Statement::Claim, consumer, id).await? == 1)
}

/// The raw commit of one key on `conn`.
async fn update<B: Statements>(
    raw: &B,
    conn: &mut Conn<B::Store>,
    consumer: &str,
    id: &str,
) -> Result<()> {
    let updated = raw.execute(conn, Statement::Commit, consumer, id).await?;
    expect_rows("UPDATE", updated, 1)
}

/// The business insert of one message on `conn`.
async fn insert_business<B: Statements>(
    raw: &B,
    conn: &mut Conn<B::Store>,
    consumer: &str,
    id: &str,
) -> Result<()> {
    let inserted = raw.execute(conn, Statement::Business, consumer, id).await?;
    expect_rows("business INSERT", inserted, 1)
}

/// An error unless a raw statement changed `wanted` rows.
pub(super) fn expect_rows(what: &str, changed: u64, wanted: usize) -> Result<()> {
    if changed == wanted as u64 {
        Ok(())
    } else {
        Err(format!("raw {what} changed {changed} rows, expected {wanted}").into())
    }
}

/// The raw baseline of an SQL backend.
pub(super) struct SqlRaw<B>(pub(super) Arc<B>);

impl<B: Statements> Raw for SqlRaw<B> {
    fn claim_commit(
        &self,
        _worker: usize,
        consumer: Arc<str>,
        message_id: String,
    ) -> BoxFuture<'static, Result<bool>> {
        let raw = Arc::clone(&self.0);
        async move {
            // Each statement on a connection of its own from the pool, as the store's are.
            let inserted = {
                let mut conn = raw.pool().acquire().await?;
                try_insert(&*raw, &mut conn, &consumer, &message_id).await?
            };
            if inserted {
                let mut conn = raw.pool().acquire().await?;
                update(&*raw, &mut conn, &consumer, &message_id).await?;
            }
            Ok(inserted)
        }
        .boxed()
    }

    fn batch(
        &self,
        _worker: usize,
        consumer: Arc<str>,
        message_ids: Vec<String>,
    ) -> BoxFuture<'static, Result<()>> {
        let raw = Arc::clone(&self.0);
        async move { raw.batch(&consumer, &message_ids).await }.boxed()
    }

    fn cleanup(&self) -> BoxFuture<'static, Result<()>> {
        let raw = Arc::clone(&self.0);
        async move { raw.cleanup().await }.boxed()
    }
}

/// The transactional mode of an SQL backend: the store's `claim_in_tx` and the baselines
/// on the raw baseline's pool, each transaction at the server's default isolation.
pub(super) struct SqlTx<B: Statements> {
    /// The raw statements and their pool.
    pub(super) raw: Arc<B>,
    /// The store under test.
    pub(super) store: B::Store,
    /// `TxInbox` as an application builds it.
    pub(super) inbox: TxInbox<B::Store>,
    /// `TxInbox` whose claim commits as the store's own lease-mode claim does.
    pub(super) inbox_as_hand: TxInbox<B::Store>,
}

impl<B: Statements> Transactional for SqlTx<B> {
    fn process(
        &self,
        flavor: TxFlavor,
        _worker: usize,
        consumer: Arc<str>,
        message_id: String,
    ) -> BoxFuture<'static, Result<()>> {
        let (raw, store) = (Arc::clone(&self.raw), self.store.clone());
        if matches!(flavor, TxFlavor::Inbox | TxFlavor::InboxAsHandWritten) {
            let inbox = if flavor == TxFlavor::Inbox {
                self.inbox.clone()
            } else {
                self.inbox_as_hand.clone()
            };
            return async move {
                let key = Key::new(&*consumer, &message_id)?;
                inbox
                    .handle(&key, None, |conn, _lease| {
                        let (raw, consumer) = (Arc::clone(&raw), Arc::clone(&consumer));
                        let id = message_id.clone();
                        Box::pin(async move {
                            insert_business(&*raw, conn, &consumer, &id).await?;
                            Ok::<_, BoxError>(None)
                        })
                    })
                    .await?;
                Ok(())
            }
            .boxed();
        }
        async move { process(&*raw, &store, flavor, &consumer, &message_id).await }.boxed()
    }
}

/// The flavors that run in transactions the bench begins itself.
async fn process<B: Statements>(
    raw: &B,
    store: &B::Store,
    flavor: TxFlavor,
    consumer: &str,
    id: &str,
) -> Result<()> {
    if flavor == TxFlavor::HandWritten {
        let key = Key::new(consumer, id)?;
        return hand_written(store, &key, |lease| async move {
            // On the store's pool, as `TxInbox` does: both then share its connections.
            let mut tx = store.pool().begin().await?;
            insert_business(raw, &mut tx, consumer, id).await?;
            store.commit_in_tx(&mut tx, &lease, None).await?;
            tx.commit().await?;
            Ok(())
        })
        .await;
    }
    let mut tx = raw.pool().begin().await?;
    match flavor {
        TxFlavor::Library => {
            let key = Key::new(consumer, id)?;
            if let TxClaim::Claimed { .. } = InTx::claim_in_tx(store, &mut tx, &key).await? {
                insert_business(raw, &mut tx, consumer, id).await?;
            }
        }
        TxFlavor::BusinessOnly => insert_business(raw, &mut tx, consumer, id).await?,
        TxFlavor::Enqueue => {
            insert_business(raw, &mut tx, consumer, id).await?;
            let message = outbox_message(&format!("{consumer}/{id}"))?;
            store.enqueue(&mut tx, &message).await?;
        }
        TxFlavor::Inbox | TxFlavor::InboxAsHandWritten | TxFlavor::HandWritten => {
            unreachable!("handled above")
        }
        TxFlavor::TwoTransactions => {
            // Insert the inbox row or meet it, and commit.
            if B::INSERT_BEFORE_LOCK || raw.lock_row(&mut tx, consumer, id).await?.is_none() {
                try_insert(raw, &mut tx, consumer, id).await?;
            }
            tx.commit().await?;
            // Lock it again, work, mark it consumed (committed below).
            tx = raw.pool().begin().await?;
            if raw.lock_row(&mut tx, consumer, id).await? == Some(false) {
                insert_business(raw, &mut tx, consumer, id).await?;
                update(raw, &mut tx, consumer, id).await?;
            }
        }
    }
    tx.commit().await?;
    Ok(())
}
