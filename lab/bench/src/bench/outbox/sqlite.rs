//! The SQLite side of the outbox rows: the enqueue measure on a temporary file.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use dedup_sqlite::rusqlite::{Connection, TransactionBehavior, params};
use dedup_sqlite::{SqliteOutbox, SqliteStore};
use futures::FutureExt;

use crate::bench::driver::drive;
use crate::bench::rounds::{best_of, contender};
use crate::bench::{Names, Params, Result, Row};

use super::support::{enqueue_row, lock, message};

/// The SQLite side: one connection per task on the store's file, writes queued on a
/// mutex for the one write lock (as the bench's other SQLite baselines do).
struct Sqlite {
    connections: Vec<Mutex<Connection>>,
    write_gate: Mutex<()>,
    outbox: SqliteOutbox,
    _tmp: tempfile::TempDir,
}

impl Sqlite {
    fn write(&self, worker: usize, id: String, with_outbox: bool) -> Result<()> {
        let mut conn = lock(&self.connections[worker % self.connections.len()]);
        let _turn = lock(&self.write_gate);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.prepare_cached("INSERT INTO business (message_id, amount) VALUES (?1, ?2)")?
            .execute(params![id, 100])?;
        if with_outbox {
            self.outbox.enqueue(&tx, &[message("/nowhere", id)?])?;
        }
        tx.commit()?;
        Ok(())
    }
}

/// Measure 2a on SQLite (a temporary file, the store's default settings).
pub(super) async fn sqlite_enqueue(params: &Params, names: &Names) -> Result<Vec<Row>> {
    let tmp = tempfile::tempdir()?;
    let path: PathBuf = tmp.path().join("outbox-bench.db");
    let store = SqliteStore::open(&path).await?;
    let connections = {
        let store = store.clone();
        let k = params.max_concurrency();
        tokio::task::spawn_blocking(move || {
            (0..k)
                .map(|_| store.open_connection().map(Mutex::new))
                .collect::<dedup_core::Result<Vec<_>>>()
        })
        .await??
    };
    connections[0].lock().unwrap().execute_batch(
        "CREATE TABLE business (id INTEGER PRIMARY KEY, message_id TEXT NOT NULL, \
         amount INTEGER NOT NULL)",
    )?;
    let sqlite = Arc::new(Sqlite {
        connections,
        write_gate: Mutex::new(()),
        outbox: store.outbox(),
        _tmp: tmp,
    });
    let setup = format!(
        "SQLite in a temporary file, the store's default settings, {} connections, run {}",
        params.max_concurrency(),
        names.run
    );
    let n = params.messages;
    let mut rows = Vec::new();
    for &c in &params.concurrency {
        let run = |with: bool, what: String, n: usize| {
            let sqlite = Arc::clone(&sqlite);
            drive(
                c,
                move |i| i < n,
                move |worker, i| {
                    let sqlite = Arc::clone(&sqlite);
                    let id = format!("{what}-{i}");
                    tokio::task::spawn_blocking(move || sqlite.write(worker, id, with))
                        .map(|joined| joined?)
                },
            )
            .boxed()
        };
        let kinds = [(true, "enqueue"), (false, "alone")];
        for (with, what) in kinds {
            run(with, format!("warm-c{c}-{what}"), params.warmup).await?;
        }
        let run = &run;
        let runs = best_of(
            params,
            kinds
                .iter()
                .map(|&(with, what)| {
                    contender(move |round| run(with, format!("c{c}-{what}-{round}"), n))
                })
                .collect(),
        )
        .await?;
        rows.push(enqueue_row("sqlite", c, n, &runs, &setup));
    }
    Ok(rows)
}
