//! The conformance suite (lease-mode and transactional clauses, the model-based test)
//! against the real MySQL / MariaDB of `DEDUP_MYSQL_URL`.

mod common;

use std::sync::atomic::Ordering;

use async_trait::async_trait;
use dedup_conformance::{
    StoreFactory, TestContext, TransactionalFactory, TxEnd, TxInboxFactory, TxJob, TxWork,
};
use dedup_core::{BoxError, Fingerprint, Handled, InboxError, Key, Lease, Result, TxClaim};
use dedup_mysql::sqlx::{self, AssertSqlSafe, MySqlConnection};
use dedup_mysql::{MySqlConfig, MySqlStore, TxInbox};
use futures::future::BoxFuture;

/// One table per clause (the clause's namespace) in the URL's database, on the clause's clock.
struct MySqlFactory;

#[async_trait]
impl StoreFactory for MySqlFactory {
    type Store = MySqlStore;

    async fn open(&self, ctx: &TestContext) -> MySqlStore {
        let url = common::url().expect("available() checked the URL");
        let store = common::store_on(&url, &ctx.namespace, Some(ctx.clock.clone())).await;
        common::create_business_table(&store).await;
        store
    }

    fn available(&self) -> bool {
        common::url().is_some()
    }

    async fn open_named(&self, ctx: &TestContext, name: &str) -> Option<Result<MySqlStore>> {
        let url = common::url().expect("available() checked the URL");
        let config = MySqlConfig {
            table: name.into(),
            clock: Some(ctx.clock.clone()),
            max_connections: 2,
            ..MySqlConfig::default()
        };
        Some(MySqlStore::connect_with(&url, config).await)
    }
}

async fn end(tx: dedup_mysql::sqlx::Transaction<'_, dedup_mysql::sqlx::MySql>, end: TxEnd) {
    match end {
        TxEnd::Commit => tx.commit().await.expect("commit"),
        TxEnd::Rollback => tx.rollback().await.expect("rollback"),
    }
}

#[async_trait]
impl TransactionalFactory for MySqlFactory {
    async fn claim_in_transaction(
        &self,
        store: &MySqlStore,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
        label: &str,
        hold: BoxFuture<'static, ()>,
        end_as: TxEnd,
    ) -> Result<TxClaim> {
        let mut tx = store.pool().begin().await.expect("begin");
        let claim = match store.claim_in_tx(&mut tx, key, fingerprint).await {
            Ok(claim) => claim,
            Err(e) => {
                tx.rollback().await.expect("rollback");
                return Err(e);
            }
        };
        if matches!(claim, TxClaim::Claimed { .. }) {
            common::insert_business_row(store, &mut tx, key, label).await;
        }
        // The transaction is still usable after a duplicate.
        let one: i32 = dedup_mysql::sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut *tx)
            .await
            .expect("a statement after the claim");
        assert_eq!(one, 1);
        hold.await;
        end(tx, end_as).await;
        Ok(claim)
    }

    async fn commit_in_transaction(
        &self,
        store: &MySqlStore,
        lease: &Lease,
        outcome: Option<&[u8]>,
        label: &str,
        end_as: TxEnd,
    ) -> Result<()> {
        let mut tx = store.pool().begin().await.expect("begin");
        common::insert_business_row(store, &mut tx, &lease.key, label).await;
        if let Err(e) = store.commit_in_tx(&mut tx, lease, outcome).await {
            tx.rollback().await.expect("rollback");
            return Err(e);
        }
        end(tx, end_as).await;
        Ok(())
    }

    async fn business_rows(&self, store: &MySqlStore, key: &Key) -> Vec<String> {
        common::business_rows(store, key).await
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

/// The business row another transaction and the handler both update to provoke a
/// serialization failure.
fn seed_id(key: &Key) -> String {
    format!("{}#seed", key.message_id())
}

/// Lock the seed row of `key` on `conn` without waiting (`FOR UPDATE NOWAIT`): refused
/// (MariaDB `1205`, MySQL 8 `3572`, both retryable) while another transaction holds it.
async fn lock_seed_nowait(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    key: &Key,
) -> std::result::Result<(), sqlx::Error> {
    let sql = format!(
        "SELECT label FROM {} WHERE consumer = ? AND message_id = ? FOR UPDATE NOWAIT",
        common::business_table(store)
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(key.consumer())
        .bind(seed_id(key))
        .fetch_all(conn)
        .await
        .map(drop)
}

#[async_trait]
impl TxInboxFactory for MySqlFactory {
    async fn tx_handle(
        &self,
        store: &MySqlStore,
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
        if matches!(kind, Kind::ConflictOnce(_)) {
            let seed = Key::new(key.consumer(), seed_id(key)).expect("seed key");
            let mut conn = store.pool().acquire().await.expect("connection");
            common::insert_business_row(store, &mut conn, &seed, "seed").await;
        }
        let inbox = TxInbox::new(store.clone())
            .with_config(config)
            .with_retry(retry);
        inbox
            .handle(key, fingerprint, move |conn, lease| {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let (kind, hang, store) = (kind.clone(), hang.take(), store.clone());
                Box::pin(async move {
                    let row = format!("row@{}", lease.attempt);
                    common::insert_business_row(&store, &mut *conn, &lease.key, &row).await;
                    match kind {
                        Kind::Succeed(outcome) => Ok(outcome),
                        Kind::Fail(message) => Err(BoxError::from(message)),
                        Kind::Hang => {
                            let (started, proceed) = hang.expect("one hanging run");
                            let _ = started.send(());
                            match proceed.await {
                                Ok(()) => Ok(None),
                                Err(_) => Err("abandoned".into()),
                            }
                        }
                        Kind::ConflictOnce(outcome) if run > 1 => Ok(outcome),
                        Kind::ConflictOnce(_) => {
                            // A concurrent transaction holds the seed row (READ
                            // COMMITTED: it locks that row alone, not the gaps around it,
                            // where the handler's own uncommitted row lies).
                            let mut other = store
                                .pool()
                                .begin_with(
                                    "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; \
                                     START TRANSACTION",
                                )
                                .await
                                .expect("begin");
                            let sql = format!(
                                "SELECT label FROM {} WHERE consumer = ? AND message_id = ? \
                                 FOR UPDATE",
                                common::business_table(&store)
                            );
                            sqlx::query(AssertSqlSafe(sql))
                                .bind(lease.key.consumer())
                                .bind(seed_id(&lease.key))
                                .fetch_all(&mut *other)
                                .await
                                .expect("the concurrent lock");
                            let refused = lock_seed_nowait(&store, conn, &lease.key).await;
                            other.rollback().await.expect("rollback");
                            match refused {
                                Err(e) => Err(BoxError::from(e)),
                                Ok(()) => panic!("the locked row was not refused"),
                            }
                        }
                    }
                })
            })
            .await
    }
}

dedup_conformance::suite!(MySqlFactory);
dedup_conformance::transactional_suite!(MySqlFactory);
dedup_conformance::tx_inbox_suite!(MySqlFactory);
dedup_conformance::admin_suite!(MySqlFactory);
