//! SQLite: the store on a database file, and the raw baseline on a plain table of the same
//! shape in the same file, through rusqlite with the store's journal mode and synchronous
//! setting, one connection per bench task. The transactional mode runs on the same
//! connections, with a business table in the same file.
//!
//! SQLite runs one writer at a time. The baseline's writers queue on a mutex for it, as
//! the store's do on its write gate: left to SQLite's busy handler, which sleeps 1, 2, 5,
//! 10, ... ms between looks at the lock, contending writers sleep while the lock is free,
//! and the baseline swung fivefold between runs.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dedup_core::{BoxError, Clock, Key, ManualClock, TxClaim};
use dedup_sqlite::rusqlite::{
    Connection, OptionalExtension, Transaction, TransactionBehavior, params,
};
use dedup_sqlite::{SCHEMA_VERSIONS_TABLE, SqliteConfig, SqliteStore, Synchronous, TxInbox};
use futures::FutureExt;
use futures::future::BoxFuture;

use super::target::{Raw, Target, Transactional, TxFlavor, hand_written, outbox_message};
use super::{Bench, NOT_SHARED, Names, Params, Result, now_ms, token};

/// Columns and primary key of the store's table (see dedup-sqlite's schema), without its
/// purge indexes: the plain table the raw statements run on.
const RAW_TABLE: &str = "CREATE TABLE \"{table}\" (
    consumer     TEXT    NOT NULL,
    message_id   TEXT    NOT NULL,
    state        TEXT    NOT NULL,
    token        TEXT,
    fence        INTEGER NOT NULL,
    attempt      INTEGER NOT NULL,
    expires_at   INTEGER,
    processed_at INTEGER,
    outcome      BLOB,
    fingerprint  TEXT,
    PRIMARY KEY (consumer, message_id)
)";

/// The store's purge index, for `--raw-indexes`.
const RAW_INDEXES: &str =
    "CREATE INDEX \"{table}_purge_idx\" ON \"{table}\" (coalesce(processed_at, expires_at));";

/// The raw claim: a fresh in-flight row, nothing when the key exists.
const INSERT: &str = "INSERT INTO \"{table}\" \
     (consumer, message_id, state, token, fence, attempt, expires_at) \
     VALUES (?1, ?2, 'in_flight', ?3, 1, 1, ?4) ON CONFLICT DO NOTHING";

/// The application's own table the transactional measures insert into.
const BUSINESS_TABLE: &str = "CREATE TABLE \"{table}\" (
    id         INTEGER PRIMARY KEY,
    consumer   TEXT    NOT NULL,
    message_id TEXT    NOT NULL,
    amount     INTEGER NOT NULL
)";

/// The business insert ($1 consumer, $2 message id, $3 amount).
const INSERT_BUSINESS: &str =
    "INSERT INTO \"{table}\" (consumer, message_id, amount) VALUES (?1, ?2, ?3)";

/// The two-transaction inbox: whether the raw table's row of a key is consumed (no row:
/// none). SQLite has no row locks: the immediate transaction's write lock stands for them.
const SELECT_STATE: &str =
    "SELECT state = 'completed' FROM \"{table}\" WHERE consumer = ?1 AND message_id = ?2";

/// The raw commit.
const UPDATE: &str = "UPDATE \"{table}\" SET state = 'completed', expires_at = NULL, \
     processed_at = ?3 WHERE consumer = ?1 AND message_id = ?2";

const DROP: &str = "DROP TABLE IF EXISTS \"{table}\"";
/// The SQLite bench, chosen by the store URL's descriptor (a file; `sqlite::memory:` is
/// refused: other processes could not share it). It also gives the default store, a
/// temporary file.
pub(crate) static BENCH: Bench = Bench {
    descriptor: &dedup_sqlite::DESCRIPTOR,
    settings: false,
    open: |target, _, names, params| {
        async move {
            match target.downcast::<dedup_sqlite::SqliteTarget>() {
                Ok(dedup_sqlite::SqliteTarget {
                    path: Some(path), ..
                }) => open(Some(path.display().to_string()), names, params).await,
                _ => Err(NOT_SHARED.into()),
            }
        }
        .boxed()
    },
    temporary: Some(|names, params| open(None, names, params).boxed()),
};

/// Open the store and the baseline on the file at `path` (a file in a new temporary
/// folder when `None`).
pub(crate) async fn open(path: Option<String>, names: &Names, params: &Params) -> Result<Target> {
    let concurrency = params.max_concurrency();
    let (path, tmp) = match path {
        Some(p) => (PathBuf::from(p), None),
        None => {
            let tmp = tempfile::tempdir()?;
            (tmp.path().join("bench.db"), Some(tmp))
        }
    };
    let config = SqliteConfig::with_table(names.table.as_str());
    let store = SqliteStore::open_with(&path, config.clone()).await?;
    let clock = Arc::new(ManualClock::starting_now());
    let purge_store = SqliteStore::open_with(
        &path,
        SqliteConfig {
            table: names.purge_table.clone(),
            clock: Some(Arc::clone(&clock) as Arc<dyn Clock>),
            ..config.clone()
        },
    )
    .await?;
    let raw = SqliteRaw::open(&path, names, &config, concurrency, tmp)?;
    raw.exec(0, &RAW_TABLE.replace("{table}", &names.raw_table))?;
    raw.exec(0, &BUSINESS_TABLE.replace("{table}", &names.business_table))?;
    if params.raw_indexes {
        raw.exec(0, &RAW_INDEXES.replace("{table}", &names.raw_table))?;
    }
    let setup = format!(
        "WAL, synchronous={:?}, store pool {}, raw {concurrency} connections{}",
        config.synchronous,
        config.pool_size,
        if params.raw_indexes {
            ", raw with the store's indexes"
        } else {
            ""
        }
    );
    let tx = SqliteTx {
        inner: Arc::clone(&raw.inner),
        store: store.clone(),
        inbox: TxInbox::new(store.clone()),
    };
    Ok(Target {
        backend: "sqlite",
        store: Arc::new(store),
        purge_store: Arc::new(purge_store),
        clock,
        raw: Arc::new(raw),
        tx: Some(Arc::new(tx)),
        setup,
    })
}

/// The raw baseline: one connection per bench task.
struct SqliteRaw {
    inner: Arc<Inner>,
}

struct Inner {
    connections: Vec<Mutex<Connection>>,
    /// Held by every write transaction.
    write_gate: Mutex<()>,
    insert: String,
    update: String,
    insert_business: String,
    select_state: String,
    /// Every table the bench made in this file, dropped at the end.
    tables: Vec<String>,
    /// The temporary folder holding the file, if the bench made it (removed on drop).
    _tmp: Option<tempfile::TempDir>,
}

impl SqliteRaw {
    fn open(
        path: &Path,
        names: &Names,
        config: &SqliteConfig,
        concurrency: usize,
        tmp: Option<tempfile::TempDir>,
    ) -> Result<Self> {
        let connections = (0..concurrency.max(1))
            .map(|_| connect(path, config).map(Mutex::new))
            .collect::<Result<_>>()?;
        let render = |sql: &str| sql.replace("{table}", &names.raw_table);
        Ok(SqliteRaw {
            inner: Arc::new(Inner {
                connections,
                write_gate: Mutex::new(()),
                insert: render(INSERT),
                update: render(UPDATE),
                insert_business: INSERT_BUSINESS.replace("{table}", &names.business_table),
                select_state: render(SELECT_STATE),
                tables: vec![
                    names.table.clone(),
                    names.raw_table.clone(),
                    names.purge_table.clone(),
                    names.business_table.clone(),
                ],
                _tmp: tmp,
            }),
        })
    }

    fn exec(&self, worker: usize, sql: &str) -> Result<()> {
        self.inner.connection(worker).execute_batch(sql)?;
        Ok(())
    }
}

/// A connection set up like the store's: WAL, the same synchronous setting and busy
/// timeout.
fn connect(path: &Path, config: &SqliteConfig) -> Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(config.busy_timeout)?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!("journal mode {mode}, expected wal").into());
    }
    let synchronous = match config.synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", synchronous)?;
    Ok(conn)
}

impl Inner {
    fn connection(&self, worker: usize) -> MutexGuard<'_, Connection> {
        lock(&self.connections[worker % self.connections.len()])
    }

    /// Wait for the right to write.
    fn write_turn(&self) -> MutexGuard<'_, ()> {
        lock(&self.write_gate)
    }

    /// The raw claim: `true` when it inserted, `false` when the key was there.
    fn try_insert(&self, conn: &Connection, consumer: &str, id: &str, now: i64) -> Result<bool> {
        let expires_at = now + Duration::from_secs(30).as_millis() as i64;
        let n = conn.prepare_cached(&self.insert)?.execute(params![
            consumer,
            id,
            token(),
            expires_at
        ])?;
        Ok(n == 1)
    }

    /// The raw claim of a key that must be fresh.
    fn insert(&self, conn: &Connection, consumer: &str, id: &str, now: i64) -> Result<()> {
        match self.try_insert(conn, consumer, id, now)? {
            true => Ok(()),
            false => expect_one("INSERT", 0),
        }
    }

    fn insert_business(&self, conn: &Connection, consumer: &str, id: &str) -> Result<()> {
        let n = conn
            .prepare_cached(&self.insert_business)?
            .execute(params![consumer, id, 100])?;
        expect_one("business INSERT", n)
    }

    /// Whether the key's inbox row is consumed (`None`: no row).
    fn consumed(&self, conn: &Connection, consumer: &str, id: &str) -> Result<Option<bool>> {
        Ok(conn
            .prepare_cached(&self.select_state)?
            .query_row(params![consumer, id], |r| r.get(0))
            .optional()?)
    }

    fn update(&self, conn: &Connection, consumer: &str, id: &str, now: i64) -> Result<()> {
        let n = conn
            .prepare_cached(&self.update)?
            .execute(params![consumer, id, now])?;
        expect_one("UPDATE", n)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

fn expect_one(what: &str, rows: usize) -> Result<()> {
    match rows {
        1 => Ok(()),
        n => Err(format!("raw {what} changed {n} rows, expected 1").into()),
    }
}

/// Run `op` on a blocking thread.
fn blocking<T: Send + 'static>(
    op: impl FnOnce() -> Result<T> + Send + 'static,
) -> BoxFuture<'static, Result<T>> {
    tokio::task::spawn_blocking(op)
        .map(|joined| joined?)
        .boxed()
}

impl Raw for SqliteRaw {
    fn claim_commit(
        &self,
        worker: usize,
        consumer: Arc<str>,
        message_id: String,
    ) -> BoxFuture<'static, Result<bool>> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let conn = inner.connection(worker);
            // Each statement its own (autocommit) transaction, as the store's claim and
            // commit are.
            let inserted = {
                let _turn = inner.write_turn();
                inner.try_insert(&conn, &consumer, &message_id, now_ms())?
            };
            if inserted {
                let _turn = inner.write_turn();
                inner.update(&conn, &consumer, &message_id, now_ms())?;
            }
            Ok(inserted)
        })
    }

    fn batch(
        &self,
        worker: usize,
        consumer: Arc<str>,
        message_ids: Vec<String>,
    ) -> BoxFuture<'static, Result<()>> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let mut conn = inner.connection(worker);
            for step in [Inner::insert, Inner::update] {
                let _turn = inner.write_turn();
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let now = now_ms();
                for id in &message_ids {
                    step(&inner, &tx, &consumer, id, now)?;
                }
                tx.commit()?;
            }
            Ok(())
        })
    }

    fn cleanup(&self) -> BoxFuture<'static, Result<()>> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let conn = inner.connection(0);
            for table in &inner.tables {
                conn.execute_batch(&DROP.replace("{table}", table))?;
            }
            let forget = format!("DELETE FROM \"{SCHEMA_VERSIONS_TABLE}\" WHERE table_name = ?1");
            for table in &inner.tables {
                conn.execute(&forget, [table])?;
            }
            Ok(())
        })
    }
}

/// The transactional mode: the store's `claim_in_tx` and the baselines on the raw
/// baseline's connections, each transaction immediate (it takes the write lock first) and
/// queued for its turn like the baseline's writes.
struct SqliteTx {
    inner: Arc<Inner>,
    store: SqliteStore,
    inbox: TxInbox,
}

impl Inner {
    /// Run `work` in one immediate transaction on `worker`'s connection, in its write turn.
    fn in_tx<T>(
        &self,
        conn: &mut Connection,
        work: impl FnOnce(&Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        let _turn = self.write_turn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = work(&tx)?;
        tx.commit()?;
        Ok(out)
    }
}

impl Transactional for SqliteTx {
    fn process(
        &self,
        flavor: TxFlavor,
        worker: usize,
        consumer: Arc<str>,
        message_id: String,
    ) -> BoxFuture<'static, Result<()>> {
        let (inner, store) = (Arc::clone(&self.inner), self.store.clone());
        // SQLite's `TxInbox` claims as the store's own `claim` does: one inbox serves both.
        if matches!(flavor, TxFlavor::Inbox | TxFlavor::InboxAsHandWritten) {
            let inbox = self.inbox.clone();
            return async move {
                let key = Key::new(&*consumer, &message_id)?;
                inbox
                    .handle(&key, None, move |tx, _lease| {
                        inner.insert_business(tx, &consumer, &message_id)?;
                        Ok::<_, BoxError>(None)
                    })
                    .await?;
                Ok(())
            }
            .boxed();
        }
        if flavor == TxFlavor::HandWritten {
            return async move {
                let key = Key::new(&*consumer, &message_id)?;
                let committing = store.clone();
                hand_written(&store, &key, |lease| {
                    blocking(move || {
                        let mut conn = inner.connection(worker);
                        inner.in_tx(&mut conn, |tx| {
                            inner.insert_business(tx, &consumer, &message_id)?;
                            committing.commit_in_tx(tx, &lease, None)?;
                            Ok(())
                        })
                    })
                })
                .await
            }
            .boxed();
        }
        blocking(move || {
            let mut conn = inner.connection(worker);
            let (consumer, id) = (&*consumer, message_id.as_str());
            match flavor {
                TxFlavor::Library => {
                    let key = Key::new(consumer, id)?;
                    inner.in_tx(&mut conn, |tx| {
                        if let TxClaim::Claimed { .. } = store.claim_in_tx(tx, &key, None)? {
                            inner.insert_business(tx, consumer, id)?;
                        }
                        Ok(())
                    })
                }
                TxFlavor::BusinessOnly => {
                    inner.in_tx(&mut conn, |tx| inner.insert_business(tx, consumer, id))
                }
                TxFlavor::Enqueue => inner.in_tx(&mut conn, |tx| {
                    inner.insert_business(tx, consumer, id)?;
                    let message = outbox_message(&format!("{consumer}/{id}"))?;
                    store.outbox().enqueue(tx, &[message])?;
                    Ok(())
                }),
                TxFlavor::Inbox | TxFlavor::InboxAsHandWritten | TxFlavor::HandWritten => {
                    unreachable!("handled above")
                }
                TxFlavor::TwoTransactions => {
                    // Lock or insert the inbox row, commit.
                    inner.in_tx(&mut conn, |tx| {
                        if inner.consumed(tx, consumer, id)?.is_none() {
                            inner.try_insert(tx, consumer, id, now_ms())?;
                        }
                        Ok(())
                    })?;
                    // Lock it again, work, mark it consumed, commit.
                    inner.in_tx(&mut conn, |tx| {
                        if inner.consumed(tx, consumer, id)? == Some(false) {
                            inner.insert_business(tx, consumer, id)?;
                            inner.update(tx, consumer, id, now_ms())?;
                        }
                        Ok(())
                    })
                }
            }
        })
    }
}
