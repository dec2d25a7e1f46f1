//! [`PostgresStore`]: the [`DedupStore`](dedup_core::DedupStore) over a PostgreSQL table.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::backend::{Storage, attempt_from, fence_from};
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, Error, Fingerprint, ItemResult,
    Key, Lease, LeaseToken, Record, Result, Timestamp, duration_millis,
};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};

use crate::config::PostgresConfig;
use crate::decode::{StatementRows, decode_record};
use crate::error::backend;
use crate::rounds::{ClaimOp, CommitOp, CommitRef, Op, Rounds, only};
use crate::statements::Statements;

/// A [`DedupStore`](dedup_core::DedupStore) keeping its records in one PostgreSQL table.
///
/// Cheap to clone (the clones share the pool). Every write is one statement (an answer
/// that writes nothing reads the record with a second one; see the crate docs); lease time comes from the server's clock unless the
/// [`PostgresConfig`] injects one. [`claim_in_tx`](Self::claim_in_tx) and
/// [`commit_in_tx`](Self::commit_in_tx) join the caller's own transaction.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    config: PostgresConfig,
    table: String,
    sql: Statements,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.inner.table)
            .field("clock", &self.inner.config.clock)
            .field("pool", &self.inner.pool)
            .finish()
    }
}

impl PostgresStore {
    /// Connect to `url` with the default [`PostgresConfig`] and [`migrate`](Self::migrate).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, PostgresConfig::default()).await
    }

    /// Connect to `url` with a pool of `config.max_connections` and
    /// [`migrate`](Self::migrate) (with `config.migrate` false: only check that the table
    /// is at this version's schema, writing nothing).
    ///
    /// The first connection is made at once, within `config.connect_timeout`: a wrong host,
    /// port, role, password, database or TLS setting fails here with the server's or the
    /// operating system's error as the source and a hint in the message.
    pub async fn connect_with(url: &str, config: PostgresConfig) -> Result<Self> {
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

    /// A store over an existing pool. Validates the names; does not touch the database
    /// (call [`migrate`](Self::migrate) unless the schema is managed elsewhere).
    pub async fn from_pool(pool: PgPool, config: PostgresConfig) -> Result<Self> {
        config.validate()?;
        let table = config.qualified_table();
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                pool,
                sql: Statements::new(&table),
                table,
                config,
            }),
        })
    }

    /// Create the schema, table and indexes when missing. Idempotent, and safe to run from
    /// many nodes at once (they take turns under an advisory lock).
    pub async fn migrate(&self) -> Result<()> {
        crate::schema::migrate(&self.inner.pool, &self.inner.config).await
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The configuration this store was built with.
    pub fn config(&self) -> &PostgresConfig {
        &self.inner.config
    }

    /// The `"schema"."table"` this store uses, quoted.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    pub(crate) fn statements(&self) -> &Statements {
        &self.inner.sql
    }

    /// The injected clock's time, bound as `$1` (NULL: the server's clock).
    pub(crate) fn now_param(&self) -> Option<i64> {
        self.inner
            .config
            .clock
            .as_ref()
            .map(|c| c.now().as_millis())
    }

    async fn conn(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>> {
        self.inner.pool.acquire().await.map_err(backend)
    }

    /// The rows of a claim / commit statement (which returns the rows it wrote), plus the
    /// stored records of the `keys` it did not write, read by a second statement on the same
    /// connection (only when there are such keys: duplicates, lost leases).
    pub(crate) async fn with_unwritten(
        &self,
        conn: &mut PgConnection,
        rows: &[PgRow],
        keys: &[&Key],
    ) -> Result<StatementRows> {
        let mut out = StatementRows::decode(rows, keys.iter().copied())?;
        let missing: Vec<&Key> = keys
            .iter()
            .copied()
            .filter(|k| !out.by_key.contains_key(*k))
            .collect();
        let read = match missing[..] {
            [] => return Ok(out),
            [one] => {
                sqlx::query(self.inner.sql.read_one.clone())
                    .bind(self.now_param())
                    .bind(one.consumer())
                    .bind(one.message_id())
                    .fetch_all(&mut *conn)
                    .await
            }
            _ => {
                sqlx::query(self.inner.sql.read_many.clone())
                    .bind(self.now_param())
                    .bind(consumers(&missing))
                    .bind(message_ids(&missing))
                    .fetch_all(&mut *conn)
                    .await
            }
        }
        .map_err(backend)?;
        out.merge(StatementRows::decode(&read, missing)?);
        Ok(out)
    }

    /// Run lease-mode claims (see [`crate::rounds`]).
    async fn run_claims(
        &self,
        conn: &mut PgConnection,
        requests: &[ClaimRequest],
    ) -> Result<Vec<Result<Claim>>> {
        let mut rounds = Rounds::<ClaimOp>::new(requests);
        while let Some(round) = rounds.next_round() {
            let rows = match round[..] {
                [one] => {
                    sqlx::query(self.inner.sql.claim.clone())
                        .bind(self.now_param())
                        .bind(one.key.consumer())
                        .bind(one.key.message_id())
                        .bind(LeaseToken::random().to_string())
                        .bind(duration_millis(one.options.lease))
                        .bind(one.options.fingerprint.as_ref().map(Fingerprint::as_str))
                        .fetch_all(&mut *conn)
                        .await
                }
                _ => {
                    let keys: Vec<&Key> = round.iter().map(|r| &r.key).collect();
                    sqlx::query(self.inner.sql.claim_many.clone())
                        .bind(self.now_param())
                        .bind(consumers(&keys))
                        .bind(message_ids(&keys))
                        .bind(
                            round
                                .iter()
                                .map(|_| LeaseToken::random().to_string())
                                .collect::<Vec<_>>(),
                        )
                        .bind(
                            round
                                .iter()
                                .map(|r| duration_millis(r.options.lease))
                                .collect::<Vec<_>>(),
                        )
                        .bind(
                            round
                                .iter()
                                .map(|r| r.options.fingerprint.as_ref().map(Fingerprint::as_str))
                                .collect::<Vec<_>>(),
                        )
                        .fetch_all(&mut *conn)
                        .await
                }
            }
            .map_err(backend)?;
            let keys: Vec<&Key> = round.iter().map(|r| &r.key).collect();
            rounds.apply(self.with_unwritten(conn, &rows, &keys).await?)?;
        }
        Ok(rounds.finish())
    }

    /// Run commits, on the pool's connection or the caller's transaction.
    pub(crate) async fn run_commits(
        &self,
        conn: &mut PgConnection,
        requests: &[CommitRef<'_>],
    ) -> Result<Vec<Result<()>>> {
        let mut rounds = Rounds::<CommitOp<'_>>::new(requests);
        while let Some(round) = rounds.next_round() {
            let keys: Vec<&Key> = round.iter().map(|r| CommitOp::key(r)).collect();
            let rows = match round[..] {
                [one] => {
                    sqlx::query(self.inner.sql.commit.clone())
                        .bind(self.now_param())
                        .bind(one.lease.key.consumer())
                        .bind(one.lease.key.message_id())
                        .bind(one.lease.token.to_string())
                        .bind(one.outcome)
                        .fetch_all(&mut *conn)
                        .await
                }
                _ => {
                    sqlx::query(self.inner.sql.commit_many.clone())
                        .bind(self.now_param())
                        .bind(consumers(&keys))
                        .bind(message_ids(&keys))
                        .bind(
                            round
                                .iter()
                                .map(|r| r.lease.token.to_string())
                                .collect::<Vec<_>>(),
                        )
                        .bind(round.iter().map(|r| r.outcome).collect::<Vec<_>>())
                        .fetch_all(&mut *conn)
                        .await
                }
            }
            .map_err(backend)?;
            rounds.apply(self.with_unwritten(conn, &rows, &keys).await?)?;
        }
        Ok(rounds.finish())
    }
}

fn consumers<'k>(keys: &[&'k Key]) -> Vec<&'k str> {
    keys.iter().map(|k| k.consumer()).collect()
}

fn message_ids<'k>(keys: &[&'k Key]) -> Vec<&'k str> {
    keys.iter().map(|k| k.message_id()).collect()
}

#[async_trait]
impl Storage for PostgresStore {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        let request = [ClaimRequest::new(key.clone(), options.clone())];
        let mut conn = self.conn().await?;
        only(self.run_claims(&mut conn, &request).await?)
    }

    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn().await?;
        self.run_claims(&mut conn, requests).await
    }

    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        let row = sqlx::query(self.inner.sql.renew.clone())
            .bind(self.now_param())
            .bind(lease.key.consumer())
            .bind(lease.key.message_id())
            .bind(lease.token.to_string())
            .bind(duration_millis(extend_by))
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(backend)?
            .ok_or_else(|| Error::lease_lost(&lease.key))?;
        let fence = fence_from(&lease.key, row.try_get("fence").map_err(backend)?)?;
        let attempt = attempt_from(
            &lease.key,
            row.try_get::<i32, _>("attempt").map_err(backend)?.into(),
        )?;
        Ok(Lease {
            key: lease.key.clone(),
            token: lease.token,
            fence,
            attempt,
            expires_at: Timestamp::from_millis(row.try_get("expires_at").map_err(backend)?),
        })
    }

    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        let mut conn = self.conn().await?;
        only(
            self.run_commits(&mut conn, &[CommitRef { lease, outcome }])
                .await?,
        )
    }

    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let refs: Vec<CommitRef<'_>> = requests.iter().map(CommitRef::from).collect();
        let mut conn = self.conn().await?;
        self.run_commits(&mut conn, &refs).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        sqlx::query(self.inner.sql.release.clone())
            .bind(self.now_param())
            .bind(lease.key.consumer())
            .bind(lease.key.message_id())
            .bind(lease.token.to_string())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(backend)?
            .map(|_| ())
            .ok_or_else(|| Error::lease_lost(&lease.key))
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        sqlx::query(self.inner.sql.get.clone())
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
            ..Capabilities::default()
        }
    }
}
