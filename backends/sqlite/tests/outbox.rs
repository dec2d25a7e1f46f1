//! The outbox on SQLite: the conformance clauses (`outbox_suite!`) on a database FILE, one
//! file and table per clause, and the consumer outbox from a `TxInbox` handler.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use dedup_conformance::TestContext;
use dedup_conformance::TxEnd;
use dedup_conformance::outbox::{OpenTx, OutboxFactory, OutboxProducer, OutboxUnderTest};
use dedup_core::outbox::{
    ConsumerOutbox, OutboxMessage, OutboxQuery, OutboxStore, derived_message_id,
};
use dedup_core::{Error, Handled, Key, Result};
use dedup_sqlite::rusqlite::{self, TransactionBehavior};
use dedup_sqlite::{SqliteConfig, SqliteStore, TxInbox};

/// Opens `<tempdir>/<namespace>.db` with records table `<namespace>` (so the outbox is
/// `<namespace>_outbox`) and the clause's clock. The directory lives as long as the factory
/// (one clause), so opening twice reaches the same rows.
struct SqliteOutboxFactory {
    dir: tempfile::TempDir,
}

impl SqliteOutboxFactory {
    fn new() -> Self {
        SqliteOutboxFactory {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn path(&self, ctx: &TestContext) -> PathBuf {
        self.dir.path().join(format!("{}.db", ctx.namespace))
    }
}

fn driver(e: rusqlite::Error) -> Error {
    Error::backend("sqlite", false, e)
}

/// Writes like an application: a business row and the messages in one `BEGIN IMMEDIATE`
/// transaction on a connection of its own.
struct Producer {
    store: SqliteStore,
}

impl Producer {
    fn business_table(&self) -> String {
        format!("biz_{}", self.store.table())
    }
}

#[async_trait]
impl OutboxProducer for Producer {
    async fn enqueue(&self, messages: &[OutboxMessage], end: TxEnd) -> Result<()> {
        let (store, messages, biz) = (self.store.clone(), messages.to_vec(), self.business_table());
        tokio::task::spawn_blocking(move || {
            let mut conn = store.open_connection()?;
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(driver)?;
            tx.execute(
                &format!("INSERT INTO \"{biz}\" (note) VALUES ('order')"),
                [],
            )
            .map_err(driver)?;
            store.outbox().enqueue(&tx, &messages)?;
            match end {
                TxEnd::Commit => tx.commit().map_err(driver),
                TxEnd::Rollback => tx.rollback().map_err(driver),
            }
        })
        .await
        .expect("blocking task")
    }

    /// SQLite has one writer: an open writing transaction would block every other.
    async fn enqueue_open(&self, _: &[OutboxMessage]) -> Result<Option<Box<dyn OpenTx>>> {
        Ok(None)
    }
}

#[async_trait]
impl OutboxFactory for SqliteOutboxFactory {
    async fn open(&self, ctx: &TestContext) -> OutboxUnderTest {
        let config = SqliteConfig {
            table: ctx.namespace.clone(),
            clock: Some(ctx.clock.clone()),
            ..SqliteConfig::default()
        };
        let store = SqliteStore::open_with(self.path(ctx), config)
            .await
            .expect("open sqlite store");
        let producer = Producer {
            store: store.clone(),
        };
        let (s, biz) = (store.clone(), producer.business_table());
        tokio::task::spawn_blocking(move || {
            let conn = s.open_connection()?;
            conn.execute(
                &format!("CREATE TABLE IF NOT EXISTS \"{biz}\" (note TEXT NOT NULL)"),
                [],
            )
            .map_err(driver)
        })
        .await
        .unwrap()
        .expect("business table");
        OutboxUnderTest {
            store: Arc::new(store.outbox()),
            producer: Arc::new(producer),
        }
    }
}

dedup_conformance::outbox_suite!(SqliteOutboxFactory::new());

/// A `TxInbox` handler writes a business row and two messages with derived ids. Its first
/// run fails (rolled back: no rows), the second commits, a duplicate delivery runs nothing:
/// the outbox holds each derived id once, and the business row is there once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tx_inbox_handler_enqueues_each_derived_id_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("consumer.db"))
        .await
        .unwrap();
    let conn = store.open_connection().unwrap();
    conn.execute("CREATE TABLE invoices (order_id TEXT NOT NULL)", [])
        .unwrap();
    let key = Key::new("billing", "order-7").unwrap();
    let inbox = TxInbox::new(store.clone());
    let runs = Arc::new(AtomicU32::new(0));

    let handler = |fail: bool, runs: Arc<AtomicU32>, outbox: dedup_sqlite::SqliteOutbox| {
        move |tx: &rusqlite::Transaction<'_>, lease: &dedup_core::Lease| {
            runs.fetch_add(1, Ordering::SeqCst);
            tx.execute("INSERT INTO invoices (order_id) VALUES ('order-7')", [])?;
            let mut out = ConsumerOutbox::new(lease);
            let messages = [
                out.message("invoices", b"invoice".to_vec())?,
                out.message("emails", b"receipt".to_vec())?,
            ];
            let new = outbox.enqueue(tx, &messages)?;
            // The same messages again in the same transaction: already there.
            let again = outbox.enqueue(tx, &messages)?;
            assert_eq!((new, again), (2, 0));
            if fail {
                return Err::<Option<Vec<u8>>, Box<dyn std::error::Error + Send + Sync>>(
                    "the payment service is down".into(),
                );
            }
            Ok(Some(b"invoiced".to_vec()))
        }
    };

    let failed = inbox
        .handle(&key, None, handler(true, runs.clone(), store.outbox()))
        .await;
    assert!(failed.is_err(), "{failed:?}");
    assert!(
        store
            .outbox()
            .list(&OutboxQuery::default())
            .await
            .unwrap()
            .is_empty(),
        "the failed run's messages were rolled back"
    );
    let handled = inbox
        .handle(&key, None, handler(false, runs.clone(), store.outbox()))
        .await
        .unwrap();
    assert!(matches!(handled, Handled::Processed { .. }), "{handled:?}");
    let duplicate = inbox
        .handle(&key, None, handler(false, runs.clone(), store.outbox()))
        .await
        .unwrap();
    assert!(
        matches!(duplicate, Handled::Duplicate { .. }),
        "{duplicate:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the duplicate ran nothing");

    let rows = store.outbox().list(&OutboxQuery::default()).await.unwrap();
    let ids: Vec<&str> = rows.iter().map(|e| e.row.message_id.as_str()).collect();
    assert_eq!(
        ids,
        vec![derived_message_id(&key, 0), derived_message_id(&key, 1)]
    );
    let invoices: i64 = conn
        .query_row("SELECT count(*) FROM invoices", [], |r| r.get(0))
        .unwrap();
    assert_eq!(invoices, 1);
}

/// A store opened without migrating refuses the outbox until its table exists, and an
/// enqueue on a connection outside a transaction commits its messages together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmigrated_outbox_is_refused_and_enqueue_outside_a_transaction_commits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("o.db");
    // The records table only, as an older version left it.
    let plain = SqliteStore::open(&path).await.unwrap();
    let conn = plain.open_connection().unwrap();
    conn.execute(
        "DELETE FROM dedup_schema_versions WHERE table_name = 'dedup_inbox_outbox'",
        [],
    )
    .unwrap();
    conn.execute("DROP TABLE dedup_inbox_outbox", []).unwrap();
    drop(plain);
    let readonly = SqliteStore::open_with(
        &path,
        SqliteConfig {
            migrate: false,
            ..SqliteConfig::default()
        },
    )
    .await
    .unwrap();
    let err = readonly.outbox().stats().await.unwrap_err();
    assert!(matches!(err, Error::SchemaNotMigrated { .. }), "{err:?}");
    let m = OutboxMessage::new("orders", "m-1", b"x".to_vec()).unwrap();
    let err = readonly
        .outbox()
        .enqueue(&conn, std::slice::from_ref(&m))
        .unwrap_err();
    assert!(matches!(err, Error::SchemaNotMigrated { .. }), "{err:?}");

    let store = SqliteStore::open(&path).await.unwrap();
    let second = OutboxMessage::new("orders", "m-2", b"y".to_vec()).unwrap();
    assert_eq!(store.outbox().enqueue(&conn, &[m, second]).unwrap(), 2);
    assert!(conn.is_autocommit(), "no transaction left open");
    assert_eq!(readonly.outbox().stats().await.unwrap().pending, 2);
}
