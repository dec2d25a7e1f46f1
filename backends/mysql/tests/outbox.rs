//! The outbox on MySQL / MariaDB (`DEDUP_MYSQL_URL`): the conformance clauses
//! (`outbox_suite!`, relays racing over ordering keys among them), producers of one key taking turns,
//! the relay polling (no wake-ups), and the consumer outbox from a `TxInbox` handler.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dedup_conformance::TestContext;
use dedup_conformance::TxEnd;
use dedup_conformance::outbox::{OpenTx, OutboxFactory, OutboxProducer, OutboxUnderTest};
use dedup_core::outbox::{
    ConsumerOutbox, MemoryPublisher, OutboxMessage, OutboxQuery, OutboxStore, Relay, RelayConfig,
    derived_message_id,
};
use dedup_core::{BoxError, Error, Handled, Key, Result};
use dedup_mysql::sqlx::{self, AssertSqlSafe, MySql, Transaction};
use dedup_mysql::{MySqlConfig, MySqlStore, TxInbox};
use futures::future::BoxFuture;

/// One records table per clause (the namespace; the outbox is `<namespace>_outbox`) in the
/// test schema, on the clause's clock.
struct MySqlOutboxFactory;

/// Writes like an application: a business row and the messages in one transaction.
struct Producer {
    store: MySqlStore,
}

struct Open(Transaction<'static, MySql>);

#[async_trait]
impl OpenTx for Open {
    async fn commit(self: Box<Self>) -> Result<()> {
        self.0
            .commit()
            .await
            .map_err(|e| Error::backend("mysql", false, e))
    }
}

impl Producer {
    async fn write(&self, messages: &[OutboxMessage]) -> Result<Transaction<'static, MySql>> {
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
impl OutboxFactory for MySqlOutboxFactory {
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

dedup_conformance::outbox_suite!(MySqlOutboxFactory);

/// Commit `messages` in a transaction of their own.
async fn enqueue(store: &MySqlStore, messages: &[OutboxMessage]) -> u64 {
    let mut tx = store.pool().begin().await.unwrap();
    let n = store.outbox().enqueue(&mut tx, messages).await.unwrap();
    tx.commit().await.unwrap();
    n
}

/// A second producer of the same ordering key waits for the first one's transaction: per
/// key, id order is commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_of_one_ordering_key_take_turns() {
    let url = url_or_skip!();
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
    let a = rows
        .iter()
        .find(|e| e.row.message_id == "a")
        .unwrap()
        .row
        .id;
    let b = rows
        .iter()
        .find(|e| e.row.message_id == "b")
        .unwrap()
        .row
        .id;
    assert!(a < b);
}

/// A `TxInbox` handler writes a business row and two messages with derived ids. Its first
/// run fails (rolled back: no rows), the second commits, a duplicate delivery runs nothing:
/// the outbox holds each derived id once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tx_inbox_handler_enqueues_each_derived_id_once() {
    let url = url_or_skip!();
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

type HandlerResult = std::result::Result<Option<Vec<u8>>, BoxError>;

/// The handler of `a_tx_inbox_handler_enqueues_each_derived_id_once`.
fn handler(
    store: MySqlStore,
    runs: Arc<AtomicU32>,
    fail: bool,
) -> impl for<'c> FnMut(
    &'c mut sqlx::MySqlConnection,
    &'c dedup_core::Lease,
) -> BoxFuture<'c, HandlerResult>
+ Send {
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

/// Opened without migrating, the outbox of a table whose outbox was never created is
/// refused with `SchemaNotMigrated`; `migrate` creates it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmigrated_outbox_is_refused_until_migrate() {
    let url = url_or_skip!();
    let store = common::store(&url, "outbox_unmigrated", None).await;
    let config = store.config().clone();
    let outbox = config.outbox_table_name();
    let mut conn = store.pool().acquire().await.unwrap();
    sqlx::query(AssertSqlSafe(format!("DROP TABLE `{outbox}`")))
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("DELETE FROM dedup_schema_versions WHERE table_name = ?")
        .bind(&outbox)
        .execute(&mut *conn)
        .await
        .unwrap();
    let readonly = MySqlStore::connect_with(
        &url,
        MySqlConfig {
            migrate: false,
            ..config.clone()
        },
    )
    .await
    .expect("the records table is current");
    let err = readonly.outbox().stats().await.unwrap_err();
    assert!(matches!(err, Error::SchemaNotMigrated { .. }), "{err:?}");
    store.migrate().await.unwrap();
    let again = MySqlStore::connect_with(
        &url,
        MySqlConfig {
            migrate: false,
            ..config
        },
    )
    .await
    .unwrap();
    assert_eq!(again.outbox().stats().await.unwrap().pending, 0);
}

/// The relay has no wake-ups on MySQL: it polls, and a committed row goes out within the
/// poll interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_polls() {
    let url = url_or_skip!();
    let store = common::store(&url, "outbox_poll", None).await;
    assert!(store.outbox().wakeups().await.unwrap().is_none());
    let publisher = Arc::new(MemoryPublisher::new());
    let relay = Relay::new(Arc::new(store.outbox()), publisher.clone())
        .with_config(RelayConfig::default().poll_interval(Duration::from_millis(100)))
        .start();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let m = OutboxMessage::new("orders", "polled-1", b"x".to_vec()).unwrap();
    let committed = Instant::now();
    assert_eq!(enqueue(&store, &[m]).await, 1);
    while publisher.message_ids().is_empty() {
        assert!(
            committed.elapsed() < Duration::from_secs(2),
            "not published within 2 s of the commit with a 100 ms poll"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(publisher.message_ids(), vec!["polled-1".to_owned()]);
    relay.stop().await;
}

/// A table of the outbox's name that the store did not create is refused, not adopted,
/// and left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_table_of_the_outbox_name_is_refused() {
    let url = url_or_skip!();
    let table = common::unique_table("outbox_foreign");
    let config = MySqlConfig {
        table: table.clone(),
        outbox_table: Some(format!("{table}_ob")),
        ..MySqlConfig::default()
    };
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE `{table}_ob` (id BIGINT PRIMARY KEY, note TEXT)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let err = MySqlStore::connect_with(&url, config).await.unwrap_err();
    assert!(err.to_string().contains("not a dedup outbox"), "{err}");
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(column_name AS CHAR) FROM information_schema.columns \
         WHERE table_schema = DATABASE() AND table_name = ? ORDER BY ordinal_position",
    )
    .bind(format!("{table}_ob"))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(columns, ["id", "note"]);
}
