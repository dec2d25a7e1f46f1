//! [`MySqlStore`]: the [`DedupStore`](dedup_core::DedupStore) over a MySQL / MariaDB table.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::backend::Storage;
use dedup_core::backend::transition::{self, Write};
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, Fingerprint, ItemResult, Key,
    Lease, LeaseToken, Record, RecordState, Result, Timestamp,
};
use sqlx::mysql::{MySqlArguments, MySqlRow};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, MySql, MySqlConnection, MySqlPool};

use crate::config::MySqlConfig;
use crate::decode::{Stored, decode_record, decode_stored, key_of};
use crate::error::{backend, lost_race, raced};
use crate::outbox_table::OutboxTable;
use crate::statements::{BEGIN, COLUMNS, Statements};

/// How many times an operation of the store's own runs again after losing a race (a
/// concurrent insert of the same new key, a deadlock) before giving up with a retryable
/// error.
const MAX_TRIES: u32 = 32;

/// Rows per write statement at most, and outcome bytes per statement at most (a batch of
/// 1 000 commits of 64 KiB is split to stay well under `max_allowed_packet`).
const MAX_ROWS_PER_WRITE: usize = 1000;
const MAX_BYTES_PER_WRITE: usize = 4 << 20;

/// A [`DedupStore`](dedup_core::DedupStore) keeping its records in one MySQL / MariaDB
/// (InnoDB) table.
///
/// Cheap to clone (the clones share the pool). Each lease-mode operation is one short
/// transaction of the store's own: a locking read of the keys (`SELECT ... FOR UPDATE`,
/// READ COMMITTED), the contract applied to what it read
/// ([`transition`](dedup_core::backend::transition)), one write statement; a batch is the
/// same with one read and one write statement for all its keys. Lease time comes from the
/// server's clock unless the [`MySqlConfig`] injects one.
/// [`claim_in_tx`](Self::claim_in_tx) and [`commit_in_tx`](Self::commit_in_tx) join the
/// caller's own transaction.
#[derive(Clone)]
pub struct MySqlStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: MySqlPool,
    config: MySqlConfig,
    table: String,
    sql: Statements,
    /// Whether the server is MariaDB (not MySQL), once asked.
    mariadb: OnceLock<bool>,
    /// The outbox's tables ([`MySqlStore::outbox`]).
    outbox: OutboxTable,
}

impl fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlStore")
            .field("table", &self.inner.table)
            .field("clock", &self.inner.config.clock)
            .field("pool", &self.inner.pool)
            .finish()
    }
}

/// The records of an operation's keys as its locking read found them, and what the
/// operation writes.
pub(crate) struct Working {
    /// The read's "now".
    pub(crate) now: Timestamp,
    slots: BTreeMap<Key, Slot>,
}

struct Slot {
    /// Whether the key had a record when read (it is locked then).
    existed: bool,
    current: Option<Record>,
    claimed_at: i64,
    dirty: bool,
}

impl Working {
    /// The key's record as the operation sees it (after its own earlier writes).
    pub(crate) fn record(&self, key: &Key) -> Option<&Record> {
        self.slots.get(key).and_then(|s| s.current.as_ref())
    }

    /// Apply a transition's write; `claimed` when it is a claim (the record's `claimed_at`
    /// becomes "now").
    pub(crate) fn apply(&mut self, key: &Key, write: Write, claimed: bool) {
        if let Write::Put(record) = write {
            let now = self.now.as_millis();
            let slot = self.slots.entry(key.clone()).or_insert(Slot {
                existed: false,
                current: None,
                claimed_at: now,
                dirty: false,
            });
            if claimed {
                slot.claimed_at = now;
            }
            slot.current = Some(record);
            slot.dirty = true;
        }
    }

    /// Remove the key's record.
    pub(crate) fn remove(&mut self, key: &Key) {
        if let Some(slot) = self.slots.get_mut(key) {
            slot.current = None;
            slot.dirty = true;
        }
    }
}

impl MySqlStore {
    /// Connect to `url` with the default [`MySqlConfig`] and [`migrate`](Self::migrate).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, MySqlConfig::default()).await
    }

    /// Connect to `url` (`mysql://user:password@host:port/database`) with a pool of
    /// `config.max_connections` and [`migrate`](Self::migrate) (with `config.migrate`
    /// false: only check that the table is at this version's schema, writing nothing).
    ///
    /// The first connection is made at once, within `config.connect_timeout`: a wrong host,
    /// port, user, password, database or TLS setting fails here with the server's or the
    /// operating system's error as the source and a hint in the message.
    pub async fn connect_with(url: &str, config: MySqlConfig) -> Result<Self> {
        config.validate()?;
        let pool = crate::connect::pool(url, &config).await?;
        let store = Self::from_pool(pool, config).await?;
        if store.inner.config.migrate {
            store
                .migrate()
                .await
                .map_err(|e| e.during("migrating the schema"))?;
        } else {
            crate::schema::check(&store.inner.pool, &store.inner.config)
                .await
                .map_err(|e| e.during("checking the schema"))?;
        }
        Ok(store)
    }

    /// A store over an existing pool. Validates the table name; does not touch the
    /// database (call [`migrate`](Self::migrate) unless the schema is managed elsewhere).
    pub async fn from_pool(pool: MySqlPool, config: MySqlConfig) -> Result<Self> {
        config.validate()?;
        let table = config.quoted_table();
        Ok(MySqlStore {
            inner: Arc::new(Inner {
                pool,
                sql: Statements::new(&table),
                outbox: OutboxTable::new(&config),
                table,
                config,
                mariadb: OnceLock::new(),
            }),
        })
    }

    /// Create the records and outbox tables and their indexes when missing, or upgrade
    /// them. Idempotent, and safe to run from many nodes at once (they take turns under a
    /// named lock).
    pub async fn migrate(&self) -> Result<()> {
        crate::schema::migrate(&self.inner.pool, &self.inner.config).await?;
        crate::outbox_schema::migrate(&self.inner.pool, &self.inner.config).await?;
        self.inner.outbox.migrated();
        Ok(())
    }

    /// The connection pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.inner.pool
    }

    /// The configuration this store was built with.
    pub fn config(&self) -> &MySqlConfig {
        &self.inner.config
    }

    /// The `` `table` `` this store uses, quoted.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    pub(crate) fn outbox_table(&self) -> &OutboxTable {
        &self.inner.outbox
    }

    pub(crate) fn statements(&self) -> &Statements {
        &self.inner.sql
    }

    /// Whether the server is MariaDB, which has statements MySQL lacks (`DELETE ...
    /// RETURNING`). Asked once (`SELECT VERSION()`), then remembered.
    pub(crate) async fn is_mariadb(&self) -> std::result::Result<bool, sqlx::Error> {
        if let Some(&mariadb) = self.inner.mariadb.get() {
            return Ok(mariadb);
        }
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&self.inner.pool)
            .await?;
        let mariadb = version.to_ascii_lowercase().contains("mariadb");
        Ok(*self.inner.mariadb.get_or_init(|| mariadb))
    }

    /// The injected clock's time, bound for "now" (NULL: the server's clock).
    pub(crate) fn now_param(&self) -> Option<i64> {
        self.inner
            .config
            .clock
            .as_ref()
            .map(|c| c.now().as_millis())
    }

    /// Read `keys` (distinct, in key order) on `conn` with "now"; `locking` keeps the rows
    /// found locked until the transaction ends. One statement, and one more for "now"
    /// when none of the keys has a record.
    pub(crate) async fn read(
        &self,
        conn: &mut MySqlConnection,
        keys: &[&Key],
        locking: bool,
    ) -> std::result::Result<(Timestamp, Vec<(Key, Stored)>), ReadError> {
        let sql = self.inner.sql.read(keys.len(), locking);
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(self.now_param());
        for key in keys {
            query = query.bind(key.consumer()).bind(key.message_id());
        }
        let rows: Vec<MySqlRow> = query.fetch_all(&mut *conn).await.map_err(ReadError::Sql)?;
        let mut now = None;
        let mut found = Vec::with_capacity(rows.len());
        for row in &rows {
            let ms: i64 = sqlx::Row::try_get(row, "now_ms").map_err(ReadError::Sql)?;
            now = Some(Timestamp::from_millis(ms));
            if let Some(key) = key_of(row).map_err(ReadError::Contract)? {
                let stored = decode_stored(row, &key).map_err(ReadError::Contract)?;
                found.push((key, stored));
            }
        }
        let now = match now {
            Some(now) => now,
            None => self.now(conn).await.map_err(ReadError::Sql)?,
        };
        Ok((now, found))
    }

    /// "Now" (the injected clock's, else the server's), read on `conn`.
    pub(crate) async fn now(
        &self,
        conn: &mut MySqlConnection,
    ) -> std::result::Result<Timestamp, sqlx::Error> {
        let ms: i64 = sqlx::query_scalar(AssertSqlSafe(self.inner.sql.now.clone()))
            .bind(self.now_param())
            .fetch_one(&mut *conn)
            .await?;
        Ok(Timestamp::from_millis(ms))
    }

    /// Run `apply` on `keys`' records in a transaction of the store's own: a locking read,
    /// `apply` (the contract, through `Working`), the writes it made, commit. A race lost
    /// to a concurrent writer (a duplicate key on insert, a deadlock) rolls back and runs
    /// it all again.
    pub(crate) async fn locked<T>(
        &self,
        what: &'static str,
        keys: &[&Key],
        mut apply: impl FnMut(&mut Working) -> T + Send,
    ) -> Result<T> {
        let mut keys: Vec<&Key> = keys.to_vec();
        keys.sort();
        keys.dedup();
        for attempt in 0..MAX_TRIES {
            if attempt > 0 {
                // Let the winner of the race commit; spread the losers out.
                let pause = 50 * u64::from(attempt.min(20));
                tokio::time::sleep(Duration::from_micros(pause)).await;
            }
            let mut tx = self.inner.pool.begin_with(BEGIN).await.map_err(backend)?;
            let (now, found) = match self.read(&mut tx, &keys, true).await {
                Ok(read) => read,
                Err(ReadError::Sql(e)) if lost_race(&e) => continue,
                Err(ReadError::Sql(e)) => return Err(backend(e)),
                Err(ReadError::Contract(e)) => return Err(e),
            };
            let mut working = Working {
                now,
                slots: found
                    .into_iter()
                    .map(|(key, stored)| {
                        (
                            key,
                            Slot {
                                existed: true,
                                current: Some(stored.record),
                                claimed_at: stored.claimed_at,
                                dirty: false,
                            },
                        )
                    })
                    .collect(),
            };
            let out = apply(&mut working);
            match self.write(&mut tx, &working).await {
                Ok(()) => {}
                Err(e) if lost_race(&e) => continue,
                Err(e) => return Err(backend(e)),
            }
            match tx.commit().await {
                Ok(()) => return Ok(out),
                Err(e) if lost_race(&e) => continue,
                Err(e) => return Err(backend(e)),
            }
        }
        Err(raced(what))
    }

    /// Write the records `working` changed: new ones with a plain insert (a concurrent
    /// insert of the same key makes it fail with a duplicate key: the race is lost), the
    /// ones read (locked) with an insert that overwrites them, removed ones with a delete.
    async fn write(
        &self,
        conn: &mut MySqlConnection,
        working: &Working,
    ) -> std::result::Result<(), sqlx::Error> {
        let removed: Vec<&Key> = working
            .slots
            .iter()
            .filter(|(_, s)| s.dirty && s.existed && s.current.is_none())
            .map(|(k, _)| k)
            .collect();
        if !removed.is_empty() {
            let mut query = sqlx::query(AssertSqlSafe(self.inner.sql.delete(removed.len())));
            for key in removed {
                query = query.bind(key.consumer()).bind(key.message_id());
            }
            query.execute(&mut *conn).await?;
        }
        for existed in [false, true] {
            let rows: Vec<(&Key, &Slot)> = working
                .slots
                .iter()
                .filter(|(_, s)| s.dirty && s.existed == existed && s.current.is_some())
                .collect();
            let mut start = 0;
            while start < rows.len() {
                let mut end = start;
                let mut bytes = 0;
                while end < rows.len() && end - start < MAX_ROWS_PER_WRITE {
                    bytes += rows[end]
                        .1
                        .current
                        .as_ref()
                        .map_or(0, |r| outcome_len(r) + 512);
                    if end > start && bytes > MAX_BYTES_PER_WRITE {
                        break;
                    }
                    end += 1;
                }
                let chunk = &rows[start..end];
                let sql = self.inner.sql.write(chunk.len(), existed);
                let mut query = sqlx::query(AssertSqlSafe(sql));
                for (key, slot) in chunk {
                    if let Some(record) = &slot.current {
                        query = bind_record(query, key, record, slot.claimed_at);
                    }
                }
                query.execute(&mut *conn).await?;
                start = end;
            }
        }
        Ok(())
    }
}

/// Why a read failed: the driver (maybe a lost race), or what it read.
pub(crate) enum ReadError {
    Sql(sqlx::Error),
    Contract(dedup_core::Error),
}

fn outcome_len(record: &Record) -> usize {
    match &record.state {
        RecordState::Completed {
            outcome: Some(o), ..
        } => o.len(),
        _ => 0,
    }
}

/// Bind `record`'s columns in [`COLUMNS`] order.
fn bind_record<'q>(
    query: Query<'q, MySql, MySqlArguments>,
    key: &Key,
    record: &Record,
    claimed_at: i64,
) -> Query<'q, MySql, MySqlArguments> {
    debug_assert_eq!(COLUMNS.len(), 12);
    let (token, expires_at, processed_at, outcome) = match &record.state {
        RecordState::InFlight { token, expires_at } => (
            Some(token.to_string()),
            Some(expires_at.as_millis()),
            None,
            None,
        ),
        RecordState::Completed {
            token,
            processed_at,
            outcome,
        } => (
            token.map(|t| t.to_string()),
            None,
            Some(processed_at.as_millis()),
            outcome.clone(),
        ),
    };
    query
        .bind(key.consumer().to_owned())
        .bind(key.message_id().to_owned())
        .bind(token)
        .bind(i64::try_from(record.fence).unwrap_or(i64::MAX))
        .bind(i64::from(record.attempt))
        .bind(claimed_at)
        .bind(expires_at)
        .bind(processed_at)
        .bind(outcome)
        .bind(record.fingerprint.as_ref().map(|f| f.as_str().to_owned()))
        .bind(record.first_claimed_at.map(|t| t.as_millis()))
        .bind(
            record
                .last_failure
                .as_ref()
                .map(dedup_core::Failure::encode),
        )
}

/// What a fast path found.
enum Fast<T> {
    /// Done, with this answer.
    Done(T),
    /// Not the common case: take the general path.
    General,
}

impl MySqlStore {
    /// Claims of new, distinct keys as one autocommit insert (see
    /// [`Statements::claim_fresh`]); `General` when any key has a record or repeats.
    async fn claim_fresh(&self, requests: &[(&Key, &ClaimOptions)]) -> Result<Fast<Vec<Claim>>> {
        let mut keys: Vec<&Key> = requests.iter().map(|(k, _)| *k).collect();
        keys.sort();
        keys.dedup();
        if keys.len() != requests.len() {
            return Ok(Fast::General);
        }
        let tokens: Vec<LeaseToken> = requests.iter().map(|_| LeaseToken::random()).collect();
        let now = self.now_param();
        let mut query = sqlx::query(AssertSqlSafe(self.inner.sql.claim_fresh(requests.len())));
        for ((key, options), token) in requests.iter().zip(&tokens) {
            query = query
                .bind(key.consumer())
                .bind(key.message_id())
                .bind(token.to_string())
                .bind(now)
                .bind(now)
                .bind(dedup_core::duration_millis(options.lease))
                .bind(fingerprint_param(options.fingerprint.as_ref()))
                .bind(now);
        }
        let done = match query.execute(&self.inner.pool).await {
            Ok(done) => done,
            // A key with a record (duplicate key), or a deadlock with a concurrent batch
            // inserting the same keys in another order: the general path decides (and
            // runs again after a lost race).
            Err(e) if lost_race(&e) => return Ok(Fast::General),
            Err(e) => return Err(backend(e)),
        };
        let now = i64::try_from(done.last_insert_id())
            .ok()
            .filter(|ms| *ms > 0)
            .map(Timestamp::from_millis)
            .ok_or_else(|| raced("claim: the server reported no time for the insert"))?;
        Ok(Fast::Done(
            requests
                .iter()
                .zip(tokens)
                .map(|((key, options), token)| {
                    Claim::Acquired(Lease {
                        key: (*key).clone(),
                        token,
                        fence: 1,
                        attempt: 1,
                        expires_at: now.saturating_add(options.lease),
                    })
                })
                .collect(),
        ))
    }

    /// Commits of leases on distinct keys still held by their tokens, as one autocommit
    /// update; `General` unless every one of them was.
    async fn commit_held(&self, requests: &[(&Lease, Option<&[u8]>)]) -> Result<Fast<()>> {
        let mut keys: Vec<&Key> = requests.iter().map(|(l, _)| &l.key).collect();
        keys.sort();
        keys.dedup();
        if keys.len() != requests.len() {
            return Ok(Fast::General);
        }
        let done = if let [(lease, outcome)] = requests {
            sqlx::query(AssertSqlSafe(self.inner.sql.commit_in_tx.clone()))
                .bind(self.now_param())
                .bind(*outcome)
                .bind(lease.key.consumer())
                .bind(lease.key.message_id())
                .bind(lease.token.to_string())
                .execute(&self.inner.pool)
                .await
        } else if requests.iter().all(|(_, outcome)| outcome.is_none()) {
            let sql = self.inner.sql.commit_held(requests.len());
            let mut query = sqlx::query(AssertSqlSafe(sql)).bind(self.now_param());
            for (lease, _) in requests {
                query = query
                    .bind(lease.key.consumer())
                    .bind(lease.key.message_id())
                    .bind(lease.token.to_string());
            }
            query.execute(&self.inner.pool).await
        } else {
            let sql = self.inner.sql.commit_held_outcomes(requests.len());
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for (lease, outcome) in requests {
                query = query
                    .bind(lease.key.consumer())
                    .bind(lease.key.message_id())
                    .bind(lease.token.to_string())
                    .bind(*outcome);
            }
            query.bind(self.now_param()).execute(&self.inner.pool).await
        };
        let done = match done {
            Ok(done) => done,
            // A deadlock with a concurrent batch: the general path runs it again.
            Err(e) if lost_race(&e) => return Ok(Fast::General),
            Err(e) => return Err(backend(e)),
        };
        // sqlx counts matched rows (CLIENT_FOUND_ROWS): each matched row was held by the
        // token and is now completed.
        Ok(if done.rows_affected() == requests.len() as u64 {
            Fast::Done(())
        } else {
            Fast::General
        })
    }
}

#[async_trait]
impl Storage for MySqlStore {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        if let Fast::Done(mut claims) = self.claim_fresh(&[(key, options)]).await?
            && let Some(claim) = claims.pop()
        {
            return Ok(claim);
        }
        self.locked("claim", &[key], |w| {
            let (claim, write) =
                transition::claim(w.record(key), key, options, w.now, LeaseToken::random())?;
            w.apply(key, write, true);
            Ok(claim)
        })
        .await?
    }

    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let fresh: Vec<(&Key, &ClaimOptions)> =
            requests.iter().map(|r| (&r.key, &r.options)).collect();
        if let Fast::Done(claims) = self.claim_fresh(&fresh).await? {
            return Ok(claims.into_iter().map(Ok).collect());
        }
        let keys: Vec<&Key> = requests.iter().map(|r| &r.key).collect();
        self.locked("claim", &keys, |w| {
            requests
                .iter()
                .map(|r| {
                    let (claim, write) = transition::claim(
                        w.record(&r.key),
                        &r.key,
                        &r.options,
                        w.now,
                        LeaseToken::random(),
                    )?;
                    w.apply(&r.key, write, true);
                    Ok(claim)
                })
                .collect()
        })
        .await
    }

    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        let key = &lease.key;
        let done = sqlx::query(AssertSqlSafe(self.inner.sql.renew.clone()))
            .bind(self.now_param())
            .bind(dedup_core::duration_millis(extend_by))
            .bind(key.consumer())
            .bind(key.message_id())
            .bind(lease.token.to_string())
            .execute(&self.inner.pool)
            .await
            .map_err(backend)?;
        if done.rows_affected() == 1
            && let Ok(expires_at) = i64::try_from(done.last_insert_id())
        {
            // Held by the token: the same acquisition, so the same fence and attempt.
            return Ok(Lease {
                expires_at: Timestamp::from_millis(expires_at),
                ..lease.clone()
            });
        }
        self.locked("renew", &[key], |w| {
            let (renewed, write) = transition::renew(w.record(key), lease, extend_by, w.now)?;
            w.apply(key, write, false);
            Ok(renewed)
        })
        .await?
    }

    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        if let Fast::Done(()) = self.commit_held(&[(lease, outcome)]).await? {
            return Ok(());
        }
        let key = &lease.key;
        self.locked("commit", &[key], |w| {
            let write = transition::commit(w.record(key), lease, outcome, w.now)?;
            w.apply(key, write, false);
            Ok(())
        })
        .await?
    }

    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let held: Vec<(&Lease, Option<&[u8]>)> = requests
            .iter()
            .map(|r| (&r.lease, r.outcome.as_deref()))
            .collect();
        if let Fast::Done(()) = self.commit_held(&held).await? {
            return Ok(requests.iter().map(|_| Ok(())).collect());
        }
        let keys: Vec<&Key> = requests.iter().map(|r| &r.lease.key).collect();
        self.locked("commit", &keys, |w| {
            requests
                .iter()
                .map(|r| {
                    let key = &r.lease.key;
                    let write =
                        transition::commit(w.record(key), &r.lease, r.outcome.as_deref(), w.now)?;
                    w.apply(key, write, false);
                    Ok(())
                })
                .collect()
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let key = &lease.key;
        let done = sqlx::query(AssertSqlSafe(self.inner.sql.release.clone()))
            .bind(self.now_param())
            .bind(key.consumer())
            .bind(key.message_id())
            .bind(lease.token.to_string())
            .execute(&self.inner.pool)
            .await
            .map_err(backend)?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        self.locked("release", &[key], |w| {
            let write = transition::release(w.record(key), lease, w.now)?;
            w.apply(key, write, false);
            Ok(())
        })
        .await?
    }

    async fn release_failed(&self, lease: &Lease, failure: &dedup_core::Failure) -> Result<()> {
        let key = &lease.key;
        let done = sqlx::query(AssertSqlSafe(self.inner.sql.release_failed.clone()))
            .bind(failure.encode())
            .bind(self.now_param())
            .bind(key.consumer())
            .bind(key.message_id())
            .bind(lease.token.to_string())
            .execute(&self.inner.pool)
            .await
            .map_err(backend)?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        self.locked("release", &[key], |w| {
            let write = transition::release_failed(w.record(key), lease, failure, w.now)?;
            w.apply(key, write, false);
            Ok(())
        })
        .await?
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        sqlx::query(AssertSqlSafe(self.inner.sql.get.clone()))
            .bind(key.consumer())
            .bind(key.message_id())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(backend)?
            .map(|row| decode_record(&row, key))
            .transpose()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            persistent: true,
            multi_process: true,
            native_batch: true,
            transactional: true,
            server_clock: self.inner.config.clock.is_none(),
            first_claim_time: true,
            failure_causes: true,
            ..Capabilities::default()
        }
    }
}

/// The fingerprint as bound.
pub(crate) fn fingerprint_param(fingerprint: Option<&Fingerprint>) -> Option<&str> {
    fingerprint.map(Fingerprint::as_str)
}
