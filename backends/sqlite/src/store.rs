//! [`SqliteStore`] and its [`Storage`] implementation: the lease-mode contract over one
//! SQLite database (dedup-core's blanket impl makes it a
//! [`DedupStore`](dedup_core::DedupStore), input checks first). The store owns its
//! connections ([`crate::connect`]) and its write queue ([`crate::writes`]).

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::backend::Storage;
use dedup_core::backend::transition::{self, Write};
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, Clock, CommitRequest, Fingerprint, ItemResult,
    Key, Lease, LeaseToken, Record, Result, SystemClock, Timestamp,
};
use rusqlite::{Connection, params};
use tokio::sync::OwnedMutexGuard;

use crate::blocking::blocking;
use crate::config::SqliteConfig;
use crate::connect::{ConnectionSettings, Location, Pool, Wait, retry_busy};
use crate::decode;
use crate::error::backend;
use crate::outbox_table::OutboxTable;
use crate::statements::Statements;
use crate::writes::{WriteOp, WriteQueue};
use crate::{outbox_schema, schema};

/// A [`DedupStore`](dedup_core::DedupStore) in a SQLite database file (or in memory), with
/// the transactional extension [`claim_in_tx`](SqliteStore::claim_in_tx) /
/// [`commit_in_tx`](SqliteStore::commit_in_tx).
///
/// Cheap to clone (clones share the connections). Every lease-mode operation is one
/// `BEGIN IMMEDIATE` transaction, on a blocking thread. The common cases are one statement
/// (a claim of a key without a record is one insert; a commit by the lease holding the key
/// is one update); every other case reads the key's record, applies
/// [`dedup_core::backend::transition`] (the reference model) and writes the result. See the crate
/// documentation for guarantees and configuration.
#[derive(Clone)]
pub struct SqliteStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// This store's writes: queued in arrival order, run in groups sharing one transaction
    /// (see [`crate::writes`]). Queuing here instead of polling SQLite's lock in its busy
    /// handler (which is unfair and can starve a waiter) leaves the busy handler to
    /// arbitrate only between processes and the caller's own connections.
    pub(crate) writes: WriteQueue<Inner>,
    pub(crate) table: String,
    pub(crate) statements: Statements,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) pool: Pool,
    /// [`SqliteConfig::block_in_place`].
    pub(crate) in_place: bool,
    /// The outbox's table ([`SqliteStore::outbox`]).
    pub(crate) outbox: OutboxTable,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("location", &self.inner.pool.location)
            .field("table", &self.inner.table)
            .field("settings", &self.inner.pool.settings)
            .field("clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Open (creating it when missing) the database file at `path` with the default
    /// configuration: table `dedup_inbox`, `synchronous = FULL`, 5 s busy timeout, system
    /// clock. Creates or migrates the table.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, SqliteConfig::default()).await
    }

    /// Open (creating it when missing) the database file at `path` with `config`.
    pub async fn open_with(path: impl AsRef<Path>, config: SqliteConfig) -> Result<Self> {
        Self::start(Location::File(path.as_ref().to_path_buf()), config).await
    }

    /// A private in-memory database with the default configuration: not persistent, not
    /// shared with other processes, and without the transactional extension (no other
    /// connection can reach it). For tests and tools.
    pub async fn open_in_memory() -> Result<Self> {
        Self::open_in_memory_with(SqliteConfig::default()).await
    }

    /// A private in-memory database with `config`.
    pub async fn open_in_memory_with(config: SqliteConfig) -> Result<Self> {
        Self::start(Location::Memory, config).await
    }

    async fn start(location: Location, config: SqliteConfig) -> Result<Self> {
        config.validate()?;
        let settings = ConnectionSettings::of(&config);
        let in_place = config.block_in_place;
        let opened = blocking(in_place, move || -> Result<SqliteStore> {
            let mut first = match &location {
                Location::File(path) => settings
                    .open_file(path, Wait::Poll)
                    .map_err(|e| crate::error::open_error(e, path))?,
                Location::Memory => settings.open_memory()?,
            };
            let outbox_table = config.outbox_table_name();
            if config.migrate {
                // One entry point for both tables: the records' and the outbox's.
                retry_busy(settings.busy_timeout, || {
                    schema::migrate(&mut first, &config.table)?;
                    outbox_schema::migrate(&mut first, &outbox_table)
                })
                .map_err(|e| e.during("migrating the schema"))?;
            } else {
                retry_busy(settings.busy_timeout, || {
                    schema::check(&first, &config.table)
                })
                .map_err(|e| e.during("checking the schema"))?;
            }
            Ok(SqliteStore {
                inner: Arc::new(Inner {
                    writes: WriteQueue::default(),
                    statements: Statements::new(&config.table),
                    clock: config.clock.unwrap_or_else(|| Arc::new(SystemClock)),
                    pool: Pool::new(location, settings, first, config.pool_size),
                    table: config.table,
                    in_place,
                    outbox: OutboxTable::new(outbox_table, config.migrate),
                }),
            })
        });
        opened.await?
    }

    /// The table holding the records.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// The database file, or `None` for an in-memory store.
    pub fn path(&self) -> Option<&Path> {
        match &self.inner.pool.location {
            Location::File(path) => Some(path),
            Location::Memory => None,
        }
    }

    /// Run `op` inside a `BEGIN IMMEDIATE` transaction, through the store's write queue
    /// (possibly sharing the transaction with other queued writes, see [`crate::writes`]),
    /// with "now" read when its turn comes; its result is returned once the transaction
    /// committed. `op` may run more than once (after a busy lock or a group's rollback):
    /// each run starts from a rolled-back state.
    pub(crate) async fn write<T: Send + 'static>(&self, op: impl WriteOp<Inner, T>) -> Result<T> {
        let queue = &self.inner.writes;
        queue
            .write(op, |gate, group| {
                self.on_connection(Some(gate), move |conn, inner| {
                    group.run(
                        conn,
                        inner,
                        inner.clock.as_ref(),
                        inner.pool.settings.busy_timeout,
                    )
                })
            })
            .await
    }

    /// Wait (asynchronously) for the store's write gate (see [`crate::writes`]), for a
    /// transaction of this process that writes outside the write queue.
    pub(crate) async fn write_gate(&self) -> OwnedMutexGuard<()> {
        self.inner.writes.gate().await
    }

    /// Run `op` on a pooled connection (see [`blocking`]), again while it fails busy
    /// (within the busy timeout). A `writer` first queues at the write gate.
    pub(crate) async fn run<T, F>(&self, writer: bool, mut op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Connection, &Inner) -> Result<T> + Send + 'static,
    {
        let gate = match writer {
            true => Some(self.inner.writes.gate().await),
            false => None,
        };
        self.on_connection(gate, move |conn, inner| {
            retry_busy(inner.pool.settings.busy_timeout, || op(conn, inner))
        })
        .await?
    }

    /// Run `op` once on a pooled connection (see [`blocking`]), holding `gate` (when given)
    /// and a pool permit until it is done, even if the caller stops waiting.
    pub(crate) async fn on_connection<T, F>(
        &self,
        gate: Option<OwnedMutexGuard<()>>,
        op: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, &Inner) -> T + Send + 'static,
    {
        let permit = self.inner.pool.permit().await;
        let inner = Arc::clone(&self.inner);
        blocking(self.inner.in_place, move || {
            let _held = (gate, permit);
            inner.pool.with_connection(|conn| op(conn, &inner))
        })
        .await?
    }
}

impl Inner {
    /// Store what the model decided.
    pub(crate) fn apply(&self, conn: &Connection, write: Write) -> Result<()> {
        match write {
            Write::Unchanged => Ok(()),
            Write::Put(record) => decode::put(conn, &self.statements, &record),
        }
    }

    /// One claim under the write lock. Storage failures are the outer error; the contract's
    /// answer (including `FingerprintMismatch`) is the inner result. A key without a record
    /// is acquired by one insert; otherwise the record is read and the model decides.
    fn claim_one(
        &self,
        conn: &Connection,
        key: &Key,
        options: &ClaimOptions,
        now: Timestamp,
    ) -> Result<ItemResult<Claim>> {
        let token = LeaseToken::random();
        let expires_at = now.saturating_add(options.lease);
        let inserted = conn
            .prepare_cached(&self.statements.claim_fresh)
            .and_then(|mut stmt| {
                stmt.execute(params![
                    key.consumer(),
                    key.message_id(),
                    token.to_string(),
                    expires_at.as_millis(),
                    options.fingerprint.as_ref().map(Fingerprint::as_str),
                    now.as_millis(),
                ])
            })
            .map_err(backend)?;
        if inserted == 1 {
            return Ok(Ok(Claim::Acquired(Lease {
                key: key.clone(),
                token,
                fence: 1,
                attempt: 1,
                expires_at,
            })));
        }
        let record = decode::select(conn, &self.statements, key)?;
        match transition::claim(record.as_ref(), key, options, now, token) {
            Ok((claim, write)) => self.apply(conn, write).map(|()| Ok(claim)),
            Err(contract) => Ok(Err(contract)),
        }
    }

    /// One commit under the write lock (outer: storage, inner: `LeaseLost`): one update
    /// when the lease's token holds the key in flight; otherwise the record is read and the
    /// model tells a retried commit (`Ok`) from a lost lease. Also used inside the caller's
    /// transaction.
    pub(crate) fn commit_one(
        &self,
        conn: &Connection,
        lease: &Lease,
        outcome: Option<&[u8]>,
        now: Timestamp,
    ) -> Result<ItemResult<()>> {
        let key = &lease.key;
        let changed = conn
            .prepare_cached(&self.statements.commit)
            .and_then(|mut stmt| {
                stmt.execute(params![
                    key.consumer(),
                    key.message_id(),
                    lease.token.to_string(),
                    now.as_millis(),
                    outcome,
                ])
            })
            .map_err(backend)?;
        if changed == 1 {
            return Ok(Ok(()));
        }
        let record = decode::select(conn, &self.statements, key)?;
        match transition::commit(record.as_ref(), lease, outcome, now) {
            Ok(write) => self.apply(conn, write).map(Ok),
            Err(contract) => Ok(Err(contract)),
        }
    }
}

#[async_trait]
impl Storage for SqliteStore {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        let (key, options) = (key.clone(), options.clone());
        self.write(move |conn, inner, now| inner.claim_one(conn, &key, &options, now)?)
            .await
    }

    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        let requests = requests.to_vec();
        self.write(move |conn, inner, now| {
            requests
                .iter()
                .map(|r| inner.claim_one(conn, &r.key, &r.options, now))
                .collect()
        })
        .await
    }

    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        let lease = lease.clone();
        self.write(move |conn, inner, now| {
            let record = decode::select(conn, &inner.statements, &lease.key)?;
            let (renewed, write) = transition::renew(record.as_ref(), &lease, extend_by, now)?;
            inner.apply(conn, write)?;
            Ok(renewed)
        })
        .await
    }

    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        let (lease, outcome) = (lease.clone(), outcome.map(<[u8]>::to_vec));
        self.write(move |conn, inner, now| {
            inner.commit_one(conn, &lease, outcome.as_deref(), now)?
        })
        .await
    }

    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        let requests = requests.to_vec();
        self.write(move |conn, inner, now| {
            requests
                .iter()
                .map(|r| inner.commit_one(conn, &r.lease, r.outcome.as_deref(), now))
                .collect()
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let lease = lease.clone();
        self.write(move |conn, inner, now| {
            let record = decode::select(conn, &inner.statements, &lease.key)?;
            let write = transition::release(record.as_ref(), &lease, now)?;
            inner.apply(conn, write)
        })
        .await
    }

    async fn release_failed(&self, lease: &Lease, failure: &dedup_core::Failure) -> Result<()> {
        let (lease, failure) = (lease.clone(), failure.clone());
        self.write(move |conn, inner, now| {
            let record = decode::select(conn, &inner.statements, &lease.key)?;
            let write = transition::release_failed(record.as_ref(), &lease, &failure, now)?;
            inner.apply(conn, write)
        })
        .await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        let key = key.clone();
        self.run(false, move |conn, inner| {
            decode::select(conn, &inner.statements, &key)
        })
        .await
    }

    fn capabilities(&self) -> Capabilities {
        let file = matches!(self.inner.pool.location, Location::File(_));
        Capabilities {
            persistent: file,
            multi_process: file,
            native_batch: true,
            transactional: file,
            first_claim_time: true,
            failure_causes: true,
            ..Capabilities::default()
        }
    }

    async fn record_purge(&self, report: &dedup_core::PurgeReport) -> Result<()> {
        self.record_purge_run(report).await
    }
}
