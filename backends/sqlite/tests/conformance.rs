//! The conformance suite (lease mode, the model-based test and the transactional clauses)
//! against `SqliteStore` on a database FILE, one file and table per clause.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dedup_conformance::{
    StoreFactory, TestContext, TransactionalFactory, TxEnd, TxInboxFactory, TxJob, TxWork,
};
use dedup_core::{BoxError, Error, Fingerprint, Handled, InboxError, Key, Lease, Result, TxClaim};
use dedup_sqlite::rusqlite::{self, TransactionBehavior, params};
use dedup_sqlite::{SqliteConfig, SqliteStore, TxInbox};
use futures::future::BoxFuture;

/// Opens `<tempdir>/<namespace>.db` with table `<namespace>` and the clause's clock. The
/// directory lives as long as the factory (one clause), so reopening sees the same file.
struct SqliteFactory {
    dir: tempfile::TempDir,
}

impl SqliteFactory {
    fn new() -> Self {
        SqliteFactory {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn path(&self, ctx: &TestContext) -> PathBuf {
        self.dir.path().join(format!("{}.db", ctx.namespace))
    }
}

/// The business table standing for the caller's own data, beside the store's table.
fn business_table(store: &SqliteStore) -> String {
    format!("biz_{}", store.table())
}

fn driver(e: rusqlite::Error) -> Error {
    Error::backend("sqlite", false, e)
}

/// Run `f` with a fresh connection to the store's file, on a blocking thread.
async fn blocking<T: Send + 'static>(
    store: &SqliteStore,
    f: impl FnOnce(&SqliteStore, &mut rusqlite::Connection) -> Result<T> + Send + 'static,
) -> Result<T> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || {
        let mut conn = store.open_connection()?;
        f(&store, &mut conn)
    })
    .await
    .expect("blocking task")
}

#[async_trait::async_trait]
impl StoreFactory for SqliteFactory {
    type Store = SqliteStore;

    async fn open(&self, ctx: &TestContext) -> SqliteStore {
        let config = SqliteConfig {
            table: ctx.namespace.clone(),
            clock: Some(ctx.clock.clone()),
            ..SqliteConfig::default()
        };
        let store = SqliteStore::open_with(self.path(ctx), config)
            .await
            .expect("open sqlite store");
        blocking(&store, |store, conn| {
            let sql = format!(
                "CREATE TABLE IF NOT EXISTS \"{}\" (consumer TEXT NOT NULL, \
                 message_id TEXT NOT NULL, label TEXT NOT NULL)",
                business_table(store)
            );
            conn.execute(&sql, []).map_err(driver)
        })
        .await
        .expect("business table");
        store
    }

    async fn open_named(
        &self,
        ctx: &TestContext,
        name: &str,
    ) -> Option<dedup_core::Result<SqliteStore>> {
        let config = SqliteConfig {
            table: name.to_string(),
            clock: Some(ctx.clock.clone()),
            ..SqliteConfig::default()
        };
        Some(SqliteStore::open_with(self.path(ctx), config).await)
    }
}

fn insert_business_row(
    tx: &rusqlite::Transaction<'_>,
    store: &SqliteStore,
    key: &Key,
    label: &str,
) -> Result<()> {
    let sql = format!(
        "INSERT INTO \"{}\" (consumer, message_id, label) VALUES (?1, ?2, ?3)",
        business_table(store)
    );
    tx.execute(&sql, params![key.consumer(), key.message_id(), label])
        .map(drop)
        .map_err(driver)
}

fn end_transaction(tx: rusqlite::Transaction<'_>, end: TxEnd) -> Result<()> {
    match end {
        TxEnd::Commit => tx.commit(),
        TxEnd::Rollback => tx.rollback(),
    }
    .map_err(driver)
}

#[async_trait::async_trait]
impl TransactionalFactory for SqliteFactory {
    async fn claim_in_transaction(
        &self,
        store: &SqliteStore,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
        label: &str,
        hold: BoxFuture<'static, ()>,
        end: TxEnd,
    ) -> Result<TxClaim> {
        let (key, fingerprint, label) = (key.clone(), fingerprint.cloned(), label.to_owned());
        let runtime = tokio::runtime::Handle::current();
        blocking(store, move |store, conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(driver)?;
            // An error drops `tx`, which rolls it back.
            let claim = store.claim_in_tx(&tx, &key, fingerprint.as_ref())?;
            if matches!(claim, TxClaim::Claimed { .. }) {
                insert_business_row(&tx, store, &key, &label)?;
            }
            let one: i64 = tx
                .query_row("SELECT 1", [], |row| row.get(0))
                .map_err(driver)?;
            assert_eq!(one, 1, "the transaction is usable after the claim");
            runtime.block_on(hold);
            end_transaction(tx, end)?;
            Ok(claim)
        })
        .await
    }

    async fn commit_in_transaction(
        &self,
        store: &SqliteStore,
        lease: &Lease,
        outcome: Option<&[u8]>,
        label: &str,
        end: TxEnd,
    ) -> Result<()> {
        let (lease, outcome, label) =
            (lease.clone(), outcome.map(<[u8]>::to_vec), label.to_owned());
        blocking(store, move |store, conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(driver)?;
            insert_business_row(&tx, store, &lease.key, &label)?;
            store.commit_in_tx(&tx, &lease, outcome.as_deref())?;
            end_transaction(tx, end)
        })
        .await
    }

    async fn business_rows(&self, store: &SqliteStore, key: &Key) -> Vec<String> {
        let key = key.clone();
        blocking(store, move |store, conn| {
            let sql = format!(
                "SELECT label FROM \"{}\" WHERE consumer = ?1 AND message_id = ?2 ORDER BY rowid",
                business_table(store)
            );
            let mut stmt = conn.prepare(&sql).map_err(driver)?;
            let labels = stmt
                .query_map(params![key.consumer(), key.message_id()], |row| row.get(0))
                .map_err(driver)?
                .collect::<rusqlite::Result<Vec<String>>>()
                .map_err(driver)?;
            Ok(labels)
        })
        .await
        .expect("business rows")
    }
}

/// What one run of the `TxWork` handler does after writing its business row.
#[derive(Clone)]
enum Kind {
    Succeed(Option<Vec<u8>>),
    Fail(String),
    Hang,
    ConflictOnce(Option<Vec<u8>>),
}

#[async_trait::async_trait]
impl TxInboxFactory for SqliteFactory {
    async fn tx_handle(
        &self,
        store: &SqliteStore,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        job: TxJob,
    ) -> std::result::Result<Handled, InboxError> {
        let TxJob {
            config,
            retry,
            work,
            runs,
        } = job;
        let (kind, mut hang) = match work {
            TxWork::Succeed(o) => (Kind::Succeed(o), None),
            TxWork::Fail(m) => (Kind::Fail(m), None),
            TxWork::Hang { started, proceed } => (Kind::Hang, Some((started, proceed))),
            TxWork::ConflictOnce(o) => (Kind::ConflictOnce(o), None),
            other => panic!("unknown work {other:?}"),
        };
        let inbox = TxInbox::new(store.clone())
            .with_config(config)
            .with_retry(retry);
        let store = store.clone();
        inbox
            .handle(key, fingerprint, move |tx, lease| {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let row = format!("row@{}", lease.attempt);
                insert_business_row(tx, &store, &lease.key, &row)?;
                match kind.clone() {
                    Kind::Succeed(outcome) => Ok(outcome),
                    Kind::Fail(message) => Err(BoxError::from(message)),
                    Kind::Hang => {
                        let (started, proceed) = hang.take().expect("one hanging run");
                        let _ = started.send(());
                        match proceed.blocking_recv() {
                            Ok(()) => Ok(None),
                            Err(_) => Err("abandoned".into()),
                        }
                    }
                    Kind::ConflictOnce(outcome) if run > 1 => Ok(outcome),
                    Kind::ConflictOnce(_) => {
                        // Another connection wants the write lock this transaction holds.
                        let other = store.open_connection()?;
                        other.busy_timeout(Duration::ZERO).map_err(driver)?;
                        match other.execute_batch("BEGIN IMMEDIATE") {
                            Err(busy) => Err(BoxError::from(busy)),
                            Ok(()) => panic!("a second writer got the lock the first holds"),
                        }
                    }
                }
            })
            .await
    }
}

dedup_conformance::suite!(SqliteFactory::new());
dedup_conformance::transactional_suite!(SqliteFactory::new());
dedup_conformance::tx_inbox_suite!(SqliteFactory::new());
dedup_conformance::admin_suite!(SqliteFactory::new());

/// The lease-mode suite again on in-memory stores (one per namespace; opening a namespace
/// again gives a clone on the same records, since nothing else can reach the database).
mod in_memory {
    use std::collections::HashMap;

    use dedup_conformance::{StoreFactory, TestContext};
    use dedup_sqlite::{SqliteConfig, SqliteStore};

    #[derive(Default)]
    struct InMemoryFactory {
        stores: tokio::sync::Mutex<HashMap<String, SqliteStore>>,
    }

    #[async_trait::async_trait]
    impl StoreFactory for InMemoryFactory {
        type Store = SqliteStore;

        async fn open(&self, ctx: &TestContext) -> SqliteStore {
            let mut stores = self.stores.lock().await;
            if let Some(store) = stores.get(&ctx.namespace) {
                return store.clone();
            }
            let config = SqliteConfig {
                clock: Some(ctx.clock.clone()),
                ..SqliteConfig::default()
            };
            let store = SqliteStore::open_in_memory_with(config)
                .await
                .expect("open in-memory store");
            stores.insert(ctx.namespace.clone(), store.clone());
            store
        }
    }

    dedup_conformance::suite!(InMemoryFactory::default());
}
