//! Outbox tests the same on every sqlx backend, and the outbox conformance factory
//! ([`SqlOutboxFactory`]): each backend's `tests/outbox.rs` includes this file as a module
//! (`#[path]`) beside its own `common` test helpers (`url`, `store`, the business table),
//! its `TxInbox`, and the aliases `Store` (its store type), `Db` (its sqlx database) and
//! `Conn` (its sqlx connection). Not a test target of its own (cargo builds `tests/*.rs`
//! only).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dedup_conformance::outbox::{OpenTx, OutboxFactory, OutboxProducer, OutboxUnderTest};
use dedup_conformance::{TestContext, TxEnd};
use dedup_core::outbox::{
    ConsumerOutbox, OutboxMessage, OutboxQuery, OutboxStore, derived_message_id,
};
use dedup_core::{BoxError, Error, Handled, Key, Result};
use dedup_sql::{SqlBackend, SqlStore};
use futures::future::BoxFuture;

use super::common;
use super::sqlx::Transaction;
use super::{Conn, Db, Store, TxInbox};

/// One records table per clause (the namespace; the outbox is `<namespace>_outbox`) in the
/// test schema, on the clause's clock.
pub struct SqlOutboxFactory;

/// Writes like an application: a business row and the messages in one transaction.
struct Producer {
    store: Store,
}

struct Open(Transaction<'static, Db>);

#[async_trait]
impl OpenTx for Open {
    async fn commit(self: Box<Self>) -> Result<()> {
        let backend = <Store as SqlStore>::Backend::NAME;
        self.0
            .commit()
            .await
            .map_err(|e| Error::backend(backend, false, e))
    }
}

impl Producer {
    async fn write(&self, messages: &[OutboxMessage]) -> Result<Transaction<'static, Db>> {
        let mut tx = self.store.pool().begin().await.expect("begin");
        let key = Key::new("producer", "order").unwrap();
        common::insert_business_row(&self.store, &mut tx, &key, "order").await;
        self.store.outbox().enqueue(&mut tx, messages).await?;
        Ok(tx)
    }
}

#[async_trait]
impl OutboxProducer for Producer {
    async fn enqueue(&self, messages: &[OutboxMessage], end: TxEnd) -> Result<()> {
        let tx = self.write(messages).await?;
        match end {
            TxEnd::Commit => tx.commit().await.expect("commit"),
            TxEnd::Rollback => tx.rollback().await.expect("rollback"),
        }
        Ok(())
    }

    async fn enqueue_open(&self, messages: &[OutboxMessage]) -> Result<Option<Box<dyn OpenTx>>> {
        Ok(Some(Box::new(Open(self.write(messages).await?))))
    }
}

#[async_trait]
impl OutboxFactory for SqlOutboxFactory {
    async fn open(&self, ctx: &TestContext) -> OutboxUnderTest {
        let url = common::url().expect("available() checked the URL");
        let store = common::store_on(&url, &ctx.namespace, Some(ctx.clock.clone())).await;
        common::create_business_table(&store).await;
        OutboxUnderTest {
            store: Arc::new(store.outbox()),
            producer: Arc::new(Producer { store }),
        }
    }

    fn available(&self) -> bool {
        common::url().is_some()
    }
}

/// Commit `messages` in a transaction of their own.
pub async fn enqueue(store: &Store, messages: &[OutboxMessage]) -> u64 {
    let mut tx = store.pool().begin().await.unwrap();
    let n = store.outbox().enqueue(&mut tx, messages).await.unwrap();
    tx.commit().await.unwrap();
    n
}

/// A second producer of the same ordering key waits for the first one's transaction: per
/// key, id order is commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_of_one_ordering_key_take_turns() {
    let Some(url) = common::url() else { return };
    let store = common::store(&url, "outbox_key_lock", None).await;
    let keyed = |id: &str| {
        OutboxMessage::new("orders", id, b"x".to_vec())
            .unwrap()
            .ordering_key("customer-1")
            .unwrap()
    };
    let mut first = store.pool().begin().await.unwrap();
    store
        .outbox()
        .enqueue(&mut first, &[keyed("a")])
        .await
        .unwrap();
    let second = {
        let store = store.clone();
        let m = keyed("b");
        tokio::spawn(async move { enqueue(&store, &[m]).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second producer did not wait for the key"
    );
    // Another key does not wait.
    let other = OutboxMessage::new("orders", "c", b"x".to_vec())
        .unwrap()
        .ordering_key("customer-2")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(2), enqueue(&store, &[other]))
        .await
        .expect("another key is not blocked");
    first.commit().await.unwrap();
    assert_eq!(second.await.unwrap(), 1);
    let rows = store.outbox().list(&OutboxQuery::default()).await.unwrap();
    let id_of = |message_id: &str| {
        rows.iter()
            .find(|e| e.row.message_id == message_id)
            .unwrap()
            .row
            .id
    };
    assert!(id_of("a") < id_of("b"));
}

/// A `TxInbox` handler writes a business row and two messages with derived ids. Its first
/// run fails (rolled back: no rows), the second commits, a duplicate delivery runs nothing:
/// the outbox holds each derived id once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tx_inbox_handler_enqueues_each_derived_id_once() {
    let Some(url) = common::url() else { return };
    let store = common::store(&url, "outbox_consumer", None).await;
    common::create_business_table(&store).await;
    let key = Key::new("billing", "order-7").unwrap();
    let inbox = TxInbox::new(store.clone());
    let runs = Arc::new(AtomicU32::new(0));
    let handle = |fail: bool| handler(store.clone(), runs.clone(), fail);
    assert!(inbox.handle(&key, None, handle(true)).await.is_err());
    assert!(
        store
            .outbox()
            .list(&OutboxQuery::default())
            .await
            .unwrap()
            .is_empty()
    );
    let handled = inbox.handle(&key, None, handle(false)).await.unwrap();
    assert!(matches!(handled, Handled::Processed { .. }), "{handled:?}");
    let duplicate = inbox.handle(&key, None, handle(false)).await.unwrap();
    assert!(
        matches!(duplicate, Handled::Duplicate { .. }),
        "{duplicate:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let rows = store.outbox().list(&OutboxQuery::default()).await.unwrap();
    let ids: Vec<&str> = rows.iter().map(|e| e.row.message_id.as_str()).collect();
    assert_eq!(
        ids,
        vec![derived_message_id(&key, 0), derived_message_id(&key, 1)]
    );
    assert_eq!(common::business_rows(&store, &key).await, vec!["invoice"]);
}

pub type HandlerResult = std::result::Result<Option<Vec<u8>>, BoxError>;

/// The handler of `a_tx_inbox_handler_enqueues_each_derived_id_once`.
pub fn handler(
    store: Store,
    runs: Arc<AtomicU32>,
    fail: bool,
) -> impl for<'c> FnMut(&'c mut Conn, &'c dedup_core::Lease) -> BoxFuture<'c, HandlerResult> + Send
{
    move |conn, lease| {
        let (store, runs) = (store.clone(), runs.clone());
        Box::pin(async move {
            runs.fetch_add(1, Ordering::SeqCst);
            common::insert_business_row(&store, &mut *conn, &lease.key, "invoice").await;
            let mut out = ConsumerOutbox::new(lease);
            let messages = [
                out.message("invoices", b"invoice".to_vec())?,
                out.message("emails", b"receipt".to_vec())?,
            ];
            let new = store.outbox().enqueue(&mut *conn, &messages).await?;
            let again = store.outbox().enqueue(&mut *conn, &messages).await?;
            assert_eq!((new, again), (2, 0));
            if fail {
                return Err(BoxError::from("the payment service is down"));
            }
            Ok(Some(b"invoiced".to_vec()))
        })
    }
}
