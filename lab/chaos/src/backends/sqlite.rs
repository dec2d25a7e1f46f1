//! SQLite in the chaos harness: the store is a file in the run's folder (nothing to
//! restart); transactional mode runs the effect row's insert through the SQLite
//! `TxInbox`.

use std::collections::HashMap;

use async_trait::async_trait;
use dedup_core::{Error, Handled, InboxError};
use dedup_sqlite::rusqlite::{Connection, params};
use dedup_sqlite::{SqliteStore, SqliteTarget, TxInbox};
use futures::FutureExt;

use super::{BoxError, ChaosBackend, StoreServer, Transactional, TxHandler, effects_ddl, target};
use crate::Window;
use crate::protocol::{announce, key};

/// The SQLite chaos module, chosen by the store URL's descriptor.
pub(super) static CHAOS: ChaosBackend = ChaosBackend {
    descriptor: &dedup_sqlite::DESCRIPTOR,
    start: |dir, _| {
        Ok(StoreServer {
            url: format!("sqlite:{}", dir.join("store.db").display()),
            restart: None,
        })
    },
    transactional: Some(Transactional {
        prepare: |t| {
            async move {
                connection(t)?.execute(&effects_ddl(), [])?;
                Ok(())
            }
            .boxed()
        },
        effects: |t| {
            async move {
                let conn = connection(t)?;
                let mut stmt =
                    conn.prepare("SELECT msg, count(*) FROM chaos_effects GROUP BY msg")?;
                let rows =
                    stmt.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))?;
                let mut counts = HashMap::new();
                for row in rows {
                    let (m, c) = row?;
                    counts.insert(m as u64, c as u64);
                }
                Ok(counts)
            }
            .boxed()
        },
        open: |t, config| {
            async move {
                let t = target::<SqliteTarget>(t)?;
                let path = t.path.as_ref().ok_or_else(|| {
                    Error::invalid(
                        "store URL",
                        "chaos workers share a file, not sqlite::memory:",
                    )
                })?;
                let store = SqliteStore::open_with(path, t.config.clone()).await?;
                Ok(Box::new(Handler(TxInbox::new(store).with_config(config)))
                    as Box<dyn TxHandler>)
            }
            .boxed()
        },
    }),
    failover: None,
};

/// A connection to the store's file.
fn connection(t: &dedup::url::StoreTarget) -> Result<Connection, BoxError> {
    let path = target::<SqliteTarget>(t)?
        .path
        .as_ref()
        .ok_or("chaos workers share a file, not sqlite::memory:")?;
    Ok(Connection::open(path)?)
}

struct Handler(TxInbox);

#[async_trait]
impl TxHandler for Handler {
    async fn handle(&self, id: u64, worker: u32) -> Result<Handled, InboxError> {
        self.0
            .handle(&key(id), None, move |tx, lease| {
                announce(Window::ClaimEffect, id);
                tx.execute(
                    "INSERT INTO chaos_effects (msg, worker, fence) VALUES (?1, ?2, ?3)",
                    params![id as i64, worker, lease.fence as i64],
                )?;
                announce(Window::EffectCommit, id);
                Ok::<_, dedup_sqlite::rusqlite::Error>(Some(b"done".to_vec()))
            })
            .await
    }
}
