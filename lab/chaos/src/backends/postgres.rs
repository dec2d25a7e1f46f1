//! PostgreSQL in the chaos harness: the store lives in the run's PostgreSQL (the queue's
//! server, which the controller crash-restarts in every run); transactional mode runs the
//! effect row's insert through the PostgreSQL `TxInbox`. Failover runs put the store on a
//! primary with a streaming standby of its own, reached through a [`SwitchingProxy`](crate::proxy::SwitchingProxy)
//! (sqlx takes one host per URL), and promote the standby mid-run.

use std::collections::HashMap;
use std::path::Path;

use async_trait::async_trait;
use dedup_core::{Handled, InboxError};
use dedup_lab::servers::ReplicaPair;
use dedup_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use dedup_postgres::{PostgresStore, PostgresTarget, TxInbox};
use futures::FutureExt;

use super::{
    BoxError, ChaosBackend, StoreServer, Transactional, TxHandler, behind_switching_front,
    effects_ddl, target,
};
use crate::protocol::{announce, key};
use crate::{Replication, Window};

/// The PostgreSQL chaos module, chosen by the store URL's descriptor.
pub(super) static CHAOS: ChaosBackend = ChaosBackend {
    descriptor: &dedup_postgres::DESCRIPTOR,
    start: |_, queue| {
        Ok(StoreServer {
            url: format!("{queue}?pool_size=2"),
            restart: None,
        })
    },
    transactional: Some(Transactional {
        prepare: |t| {
            async move {
                let pool = PgPool::connect(&target::<PostgresTarget>(t)?.url).await?;
                sqlx::query(AssertSqlSafe(effects_ddl()))
                    .execute(&pool)
                    .await?;
                Ok(())
            }
            .boxed()
        },
        effects: |t| {
            async move {
                let pool = PgPool::connect(&target::<PostgresTarget>(t)?.url).await?;
                let rows: Vec<(i64, i64)> =
                    sqlx::query_as("SELECT msg, count(*) FROM chaos_effects GROUP BY msg")
                        .fetch_all(&pool)
                        .await?;
                Ok::<_, BoxError>(
                    rows.into_iter()
                        .map(|(m, c)| (m as u64, c as u64))
                        .collect::<HashMap<_, _>>(),
                )
            }
            .boxed()
        },
        open: |t, config| {
            async move {
                let t = target::<PostgresTarget>(t)?;
                let store = PostgresStore::connect_with(&t.url, t.config.clone()).await?;
                Ok(Box::new(Handler(TxInbox::new(store).with_config(config)))
                    as Box<dyn TxHandler>)
            }
            .boxed()
        },
    }),
    failover: Some(failover),
};

/// The primary's settings for `replication` (the pair starts asynchronous).
fn replication_settings(replication: Replication) -> &'static [&'static str] {
    match replication {
        Replication::Async => &[],
        Replication::Sync => &[
            "ALTER SYSTEM SET synchronous_standby_names = 'standby1'",
            "ALTER SYSTEM SET synchronous_commit = 'on'",
            "SELECT pg_reload_conf()",
        ],
        Replication::RemoteApply => &[
            "ALTER SYSTEM SET synchronous_standby_names = 'standby1'",
            "ALTER SYSTEM SET synchronous_commit = 'remote_apply'",
            "SELECT pg_reload_conf()",
        ],
    }
}

/// [`ChaosBackend::failover`]: a primary and a standby in `dir`, replicated as asked, the
/// store behind a front on the primary; the restart SIGKILLs the primary, promotes the
/// standby and points the front at it.
fn failover(dir: &Path, replication: Replication) -> Result<StoreServer, BoxError> {
    let pair = ReplicaPair::postgres(&dir.join("replica"))?;
    let runtime = tokio::runtime::Handle::current();
    runtime.block_on(async {
        let pool = PgPool::connect(pair.primary_url()).await?;
        for statement in replication_settings(replication) {
            sqlx::raw_sql(AssertSqlSafe(*statement))
                .execute(&pool)
                .await?;
        }
        Ok::<_, BoxError>(())
    })?;
    behind_switching_front(pair, |front| {
        format!("postgres://postgres@{front}/dedup?pool_size=2")
    })
}

struct Handler(TxInbox);

#[async_trait]
impl TxHandler for Handler {
    async fn handle(&self, id: u64, worker: u32) -> Result<Handled, InboxError> {
        self.0
            .handle(&key(id), None, |conn, lease| {
                Box::pin(async move {
                    announce(Window::ClaimEffect, id);
                    sqlx::query(
                        "INSERT INTO chaos_effects (msg, worker, fence) VALUES ($1, $2, $3)",
                    )
                    .bind(id as i64)
                    .bind(worker as i64)
                    .bind(lease.fence as i64)
                    .execute(&mut *conn)
                    .await?;
                    announce(Window::EffectCommit, id);
                    Ok::<_, sqlx::Error>(Some(b"done".to_vec()))
                })
            })
            .await
    }
}
