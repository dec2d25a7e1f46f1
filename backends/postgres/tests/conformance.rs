//! The conformance suite (lease-mode and transactional clauses, the model-based test)
//! against the real PostgreSQL of `DEDUP_POSTGRES_URL`.

mod common;

use async_trait::async_trait;
use dedup_conformance::{StoreFactory, TestContext, TransactionalFactory, TxEnd};
use dedup_core::{Fingerprint, Key, Lease, Result, TxClaim};
use dedup_postgres::{PostgresConfig, PostgresStore};
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

dedup_conformance::suite!(PostgresFactory);
dedup_conformance::transactional_suite!(PostgresFactory);
dedup_conformance::admin_suite!(PostgresFactory);
