//! MySQL / MariaDB in the chaos harness: the store lives in a private MariaDB of the run
//! (`scripts/services.sh`), killed and restarted once; transactional mode runs the effect
//! row's insert through the MySQL `TxInbox`.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use dedup_core::{Handled, InboxError};
use dedup_mysql::sqlx::{self, AssertSqlSafe, MySqlPool};
use dedup_mysql::{MySqlStore, MySqlTarget, TxInbox};
use futures::FutureExt;

use super::{
    BoxError, ChaosBackend, Restart, StoreServer, Transactional, TxHandler, effects_ddl, target,
};
use crate::chaos::Window;
use crate::chaos::protocol::{announce, key};
use crate::chaos::servers::Service;

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
    failover: None,
};

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
