//! The conformance factory the same on every sqlx backend (lease-mode, transactional and
//! `TxInbox` clauses): each backend's `tests/conformance.rs` includes this file as a module
//! (`#[path]`) beside its `common` helpers, its `TxInbox`, the aliases `Store` and `Db`,
//! and the two steps that provoke a conflict its database asks to retry
//! (`before_conflict`, run first in the handler's transaction, and `conflict`). Not a test
//! target of its own (cargo builds `tests/*.rs` only).

use std::sync::atomic::Ordering;

use async_trait::async_trait;
use dedup_conformance::{
    StoreFactory, TestContext, TransactionalFactory, TxEnd, TxInboxFactory, TxJob, TxWork,
};
use dedup_core::{BoxError, Fingerprint, Handled, InboxError, Key, Lease, Result, TxClaim};
use futures::future::BoxFuture;

use super::{Db, Store, TxInbox, before_conflict, common, conflict, sqlx};

/// One table per clause (the clause's namespace), on the clause's clock.
pub struct SqlFactory;

#[async_trait]
impl StoreFactory for SqlFactory {
    type Store = Store;

    async fn open(&self, ctx: &TestContext) -> Store {
        let url = common::url().expect("available() checked the URL");
        let store = common::store_on(&url, &ctx.namespace, Some(ctx.clock.clone())).await;
        common::create_business_table(&store).await;
        store
    }

    fn available(&self) -> bool {
        common::url().is_some()
    }

    async fn open_named(&self, ctx: &TestContext, name: &str) -> Option<Result<Store>> {
        let url = common::url().expect("available() checked the URL");
        let mut config = common::config(name);
        config.clock = Some(ctx.clock.clone());
        config.max_connections = 2;
        Some(Store::connect_with(&url, config).await)
    }
}

async fn end(tx: sqlx::Transaction<'_, Db>, end: TxEnd) {
    match end {
        TxEnd::Commit => tx.commit().await.expect("commit"),
        TxEnd::Rollback => tx.rollback().await.expect("rollback"),
    }
}

#[async_trait]
impl TransactionalFactory for SqlFactory {
    async fn claim_in_transaction(
        &self,
        store: &Store,
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
        let one: i32 = sqlx::query_scalar("SELECT 1")
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
        store: &Store,
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

    async fn business_rows(&self, store: &Store, key: &Key) -> Vec<String> {
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

/// The business row another transaction and the handler both touch to provoke a
/// conflict the database asks to retry.
pub fn seed_id(key: &Key) -> String {
    format!("{}#seed", key.message_id())
}

#[async_trait]
impl TxInboxFactory for SqlFactory {
    async fn tx_handle(
        &self,
        store: &Store,
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
                    if matches!(kind, Kind::ConflictOnce(_)) && run == 1 {
                        before_conflict(conn).await;
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
                        Kind::ConflictOnce(_) => match conflict(&store, conn, &lease.key).await {
                            Err(e) => Err(BoxError::from(e)),
                            Ok(()) => panic!("the racing transaction did not conflict"),
                        },
                    }
                })
            })
            .await
    }
}
