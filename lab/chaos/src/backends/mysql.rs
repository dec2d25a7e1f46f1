//! MySQL / MariaDB in the chaos harness: the store lives in a private MariaDB of the run
//! (`scripts/services.sh`), killed and restarted once; transactional mode runs the effect
//! row's insert through the MySQL `TxInbox`. Failover runs put the store on a primary with
//! a replica of its own (`mariadb-replica`), reached through a [`SwitchingProxy`](crate::proxy::SwitchingProxy), and
//! promote the replica mid-run.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use dedup_core::{Handled, InboxError};
use dedup_lab::servers::{ReplicaPair, Service};
use dedup_mysql::sqlx::{self, AssertSqlSafe, MySqlPool};
use dedup_mysql::{MySqlStore, MySqlTarget, TxInbox};
use futures::FutureExt;

use super::{
    BoxError, ChaosBackend, Restart, StoreServer, Transactional, TxHandler, behind_switching_front,
    effects_ddl, target,
};
use crate::protocol::{announce, key};
use crate::{Replication, Window};

/// The MySQL / MariaDB chaos module, chosen by the store URL's descriptor.
pub(super) static CHAOS: ChaosBackend = ChaosBackend {
    descriptor: &dedup_mysql::DESCRIPTOR,
    start: |dir, _| {
        let server = Service::start(&dir.join("mariadb"), "mariadb", "DEDUP_MYSQL_URL")?;
        Ok(StoreServer {
            url: format!("{}?pool_size=2", server.url),
            restart: Some(Restart {
                name: "mariadb",
                crash_restart: Arc::new(move || server.crash_restart()),
            }),
        })
    },
    transactional: Some(Transactional {
        prepare: |t| {
            async move {
                let pool = MySqlPool::connect(&target::<MySqlTarget>(t)?.url).await?;
                sqlx::query(AssertSqlSafe(effects_ddl()))
                    .execute(&pool)
                    .await?;
                Ok(())
            }
            .boxed()
        },
        effects: |t| {
            async move {
                let pool = MySqlPool::connect(&target::<MySqlTarget>(t)?.url).await?;
                let rows: Vec<(i64, i64)> = sqlx::query_as(
                    "SELECT msg, CAST(count(*) AS SIGNED) FROM chaos_effects GROUP BY msg",
                )
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
                let t = target::<MySqlTarget>(t)?;
                let store = MySqlStore::connect_with(&t.url, t.config.clone()).await?;
                Ok(Box::new(Handler(TxInbox::new(store).with_config(config)))
                    as Box<dyn TxHandler>)
            }
            .boxed()
        },
    }),
    failover: Some(failover),
};

/// [`ChaosBackend::failover`]: a primary and a replica in `dir`, replicated as asked, the
/// store behind a front on the primary; the restart SIGKILLs the primary, promotes the
/// replica (after it applied what it had received) and points the front at it.
fn failover(dir: &Path, replication: Replication) -> Result<StoreServer, BoxError> {
    if replication == Replication::RemoteApply {
        return Err(
            "remote-apply is PostgreSQL's; MariaDB runs async or sync (semi-synchronous)".into(),
        );
    }
    let pair = ReplicaPair::mariadb(&dir.join("replica"))?;
    if replication == Replication::Sync {
        tokio::runtime::Handle::current().block_on(semi_sync(&pair))?;
    }
    behind_switching_front(pair, |front| {
        format!("mysql://dedup:dedup@{front}/dedup?pool_size=2")
    })
}

/// Make the pair semi-synchronous and lossless: the primary acknowledges a commit once the
/// replica has its events (`AFTER_SYNC`: before the commit is visible to anyone), waiting
/// for it a minute before it would fall back to asynchronous. The replica reconnects to
/// take the semi-synchronous part; returns when the primary counts it.
async fn semi_sync(pair: &ReplicaPair) -> Result<(), BoxError> {
    let primary = MySqlPool::connect(pair.primary_url()).await?;
    for statement in [
        "SET GLOBAL rpl_semi_sync_master_wait_point = 'AFTER_SYNC'",
        "SET GLOBAL rpl_semi_sync_master_timeout = 60000",
        "SET GLOBAL rpl_semi_sync_master_enabled = ON",
    ] {
        sqlx::raw_sql(AssertSqlSafe(statement))
            .execute(&primary)
            .await?;
    }
    let replica = MySqlPool::connect(&pair.standby_url).await?;
    sqlx::raw_sql("STOP SLAVE IO_THREAD; START SLAVE IO_THREAD")
        .execute(&replica)
        .await?;
    for _ in 0..100 {
        let (_, clients): (String, String) =
            sqlx::query_as("SHOW STATUS LIKE 'Rpl_semi_sync_master_clients'")
                .fetch_one(&primary)
                .await?;
        if clients == "1" {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err("the MariaDB replica did not connect semi-synchronously".into())
}

struct Handler(TxInbox);

#[async_trait]
impl TxHandler for Handler {
    async fn handle(&self, id: u64, worker: u32) -> Result<Handled, InboxError> {
        self.0
            .handle(&key(id), None, |conn, lease| {
                Box::pin(async move {
                    announce(Window::ClaimEffect, id);
                    sqlx::query("INSERT INTO chaos_effects (msg, worker, fence) VALUES (?, ?, ?)")
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
