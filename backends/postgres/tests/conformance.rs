//! The conformance suite (lease-mode and transactional clauses, the model-based test)
//! against the real PostgreSQL of `DEDUP_POSTGRES_URL`.

mod common;

use std::sync::atomic::Ordering;

use async_trait::async_trait;
use dedup_conformance::{
    StoreFactory, TestContext, TransactionalFactory, TxEnd, TxInboxFactory, TxJob, TxWork,
};
use dedup_core::{BoxError, Fingerprint, Handled, InboxError, Key, Lease, Result, TxClaim};
use dedup_postgres::sqlx::{self, AssertSqlSafe, PgConnection};
use dedup_postgres::{PostgresConfig, PostgresStore, TxInbox};
use futures::future::BoxFuture;

/// One table per clause (the clause's namespace) in the test schema, on the clause's clock.
struct PostgresFactory;

#[async_trait]
impl StoreFactory for PostgresFactory {
    type Store = PostgresStore;

    async fn open(&self, ctx: &TestContext) -> PostgresStore {
        let url = common::url().expect("available() checked the URL");
        let store = common::store_on(&url, &ctx.namespace, Some(ctx.clock.clone())).await;
        common::create_business_table(&store).await;
        store
    }

    fn available(&self) -> bool {
        common::url().is_some()
    }

    async fn open_named(&self, ctx: &TestContext, name: &str) -> Option<Result<PostgresStore>> {
        let url = common::url().expect("available() checked the URL");
        let config = PostgresConfig {
            schema: common::SCHEMA.into(),
            table: name.into(),
            clock: Some(ctx.clock.clone()),
            max_connections: 2,
            ..PostgresConfig::default()
        };
        Some(PostgresStore::connect_with(&url, config).await)
    }
}

async fn end(
    tx: dedup_postgres::sqlx::Transaction<'_, dedup_postgres::sqlx::Postgres>,
    end: TxEnd,
) {
    match end {
        TxEnd::Commit => tx.commit().await.expect("commit"),
        TxEnd::Rollback => tx.rollback().await.expect("rollback"),
    }
}

#[async_trait]
impl TransactionalFactory for PostgresFactory {
    async fn claim_in_transaction(
        &self,
        store: &PostgresStore,
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
        let one: i32 = dedup_postgres::sqlx::query_scalar("SELECT 1")
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
        store: &PostgresStore,
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

    async fn business_rows(&self, store: &PostgresStore, key: &Key) -> Vec<String> {
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

/// Bump the seed row of `key` on `conn` (a `40001` under SERIALIZABLE when a concurrent
/// transaction bumped it after this one's snapshot).
async fn bump_seed(
    store: &PostgresStore,
    conn: &mut PgConnection,
    key: &Key,
) -> std::result::Result<(), sqlx::Error> {
    let sql = format!(
        "UPDATE {} SET label = label || '+' WHERE consumer = $1 AND message_id = $2",
        common::business_table(store)
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(key.consumer())
        .bind(seed_id(key))
        .execute(conn)
        .await
        .map(drop)
}

#[async_trait]
impl TxInboxFactory for PostgresFactory {
    async fn tx_handle(
        &self,
        store: &PostgresStore,
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
                    let conflict = matches!(kind, Kind::ConflictOnce(_)) && run == 1;
                    if conflict {
                        sqlx::query("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                            .execute(&mut *conn)
                            .await
                            .expect("serializable");
                    }
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
                            let mut other = store.pool().acquire().await.expect("connection");
                            bump_seed(&store, &mut other, &lease.key)
                                .await
                                .expect("the concurrent write");
                            match bump_seed(&store, conn, &lease.key).await {
                                Err(e) => Err(BoxError::from(e)),
                                Ok(()) => panic!("the racing write did not conflict"),
                            }
                        }
                    }
                })
            })
            .await
    }
}

dedup_conformance::suite!(PostgresFactory);
dedup_conformance::transactional_suite!(PostgresFactory);
dedup_conformance::tx_inbox_suite!(PostgresFactory);
dedup_conformance::admin_suite!(PostgresFactory);
