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
use sqlx::{PgConnection, PgPool, Row, SqlStr};

use crate::config::PostgresConfig;
use crate::decode::{StatementRows, decode_record};
use crate::error::{BACKEND, backend};
use crate::group::Grouper;
use crate::outbox_table::OutboxTable;
use crate::rounds::{ClaimOp, CommitOp, CommitRef, Op, Rounds, only};
use crate::statements::Statements;

/// A [`DedupStore`](dedup_core::DedupStore) keeping its records in one PostgreSQL table.
///
/// Cheap to clone (the clones share the pool and the group commit queues). Every write is
/// one statement (an answer that writes nothing reads the record with a second one; see the
/// crate docs), and concurrent single claims, and commits, share statements
/// ([`PostgresConfig::group_commit`]); lease time comes from the server's clock unless the
/// [`PostgresConfig`] injects one. [`claim_in_tx`](Self::claim_in_tx) and
/// [`commit_in_tx`](Self::commit_in_tx) join the caller's own transaction.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
    /// This handle's claims commit asynchronously ([`Self::lazy_claims`]).
    lazy_claims: bool,
}

struct Inner {
    pool: PgPool,
    config: PostgresConfig,
    table: String,
    sql: Statements,
    /// The outbox's table ([`PostgresStore::outbox`]).
    outbox: OutboxTable,
    /// Single claims waiting for a grouped statement (`None`: group commit is off).
    claims: Option<Grouper<ClaimRequest, Claim>>,
    /// The same for the claims of [`PostgresStore::lazy_claims`] handles.
    lazy_claims: Option<Grouper<ClaimRequest, Claim>>,
    /// Single commits waiting for a grouped statement (`None`: group commit is off).
    commits: Option<Grouper<CommitRequest, ()>>,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.inner.table)
            .field("clock", &self.inner.config.clock)
            .field("lazy_claims", &self.lazy_claims)
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
        let group = config.group_commit;
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                pool,
                sql: Statements::new(&table),
                outbox: OutboxTable::new(&config),
                table,
                config,
                claims: group.map(|g| Grouper::new(g.rounds, g.max_requests)),
                lazy_claims: group.map(|g| Grouper::new(g.rounds, g.max_requests)),
                commits: group.map(|g| Grouper::new(g.rounds, g.max_requests)),
            }),
            lazy_claims: false,
        })
    }

    /// Create the schema, the records and outbox tables and their indexes when missing. Idempotent, and safe to run from
    /// many nodes at once (they take turns under an advisory lock).
    pub async fn migrate(&self) -> Result<()> {
        crate::schema::migrate(&self.inner.pool, &self.inner.config).await?;
        self.inner.outbox.migrated();
        Ok(())
    }

    /// A handle on the same store (pool, table, queues) whose lease-mode claims
    /// ([`claim`](dedup_core::DedupStore::claim), `claim_many`) commit asynchronously:
    /// each claim statement sets `synchronous_commit = off` for its own transaction (see
    /// [`crate::statements::LAZY_COMMIT`]), so it returns once written, without waiting for
    /// the log flush. Everything else (commits, renewals, releases, reads) is unchanged.
    ///
    /// For [`TxInbox`](crate::TxInbox)'s attempt-counting claim only: a server crash can
    /// lose such a claim unless a later durable commit on the server flushed the log past
    /// it (the log is flushed in order).
    pub(crate) fn lazy_claims(&self) -> PostgresStore {
        PostgresStore {
            inner: Arc::clone(&self.inner),
            lazy_claims: true,
        }
    }

    /// This handle's single and many-key claim statements: the lazy forms for a
    /// [`lazy_claims`](Self::lazy_claims) handle.
    fn claim_statements(&self) -> (&SqlStr, &SqlStr) {
        let sql = &self.inner.sql;
        if self.lazy_claims {
            (&sql.claim_lazy, &sql.claim_many_lazy)
        } else {
            (&sql.claim, &sql.claim_many)
        }
    }

    pub(crate) fn outbox_table(&self) -> &OutboxTable {
        &self.inner.outbox
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
        self.claim_rounds(conn, &mut rounds)
            .await
            .map_err(|f| f.error)?;
        Ok(rounds.finish())
    }

    /// Run `rounds` of lease-mode claims to the end, or to the first error (the results
    /// decided by then stay in `rounds`).
    async fn claim_rounds(
        &self,
        conn: &mut PgConnection,
        rounds: &mut Rounds<'_, ClaimOp>,
    ) -> Result<(), Failure> {
        while let Some(round) = rounds.next_round() {
            let rows = match round[..] {
                [one] => {
                    sqlx::query(self.claim_statements().0.clone())
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
                    sqlx::query(self.claim_statements().1.clone())
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
            };
            let keys: Vec<&Key> = round.iter().map(|r| &r.key).collect();
            self.settle(conn, rounds, rows, &keys).await?;
        }
        Ok(())
    }

    /// Run commits, on the pool's connection or the caller's transaction.
    pub(crate) async fn run_commits(
        &self,
        conn: &mut PgConnection,
        requests: &[CommitRef<'_>],
    ) -> Result<Vec<Result<()>>> {
        let mut rounds = Rounds::<CommitOp<'_>>::new(requests);
        self.commit_rounds(conn, &mut rounds)
            .await
            .map_err(|f| f.error)?;
        Ok(rounds.finish())
    }

    /// Run `rounds` of commits to the end, or to the first error (the results decided by
    /// then stay in `rounds`).
    async fn commit_rounds(
        &self,
        conn: &mut PgConnection,
        rounds: &mut Rounds<'_, CommitOp<'_>>,
    ) -> Result<(), Failure> {
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
            };
            self.settle(conn, rounds, rows, &keys).await?;
        }
        Ok(())
    }

    /// Take in what a round's statement on `keys` returned: its rows plus the records of
    /// the keys it did not write (read on `conn`) answer the round's requests. When the
    /// read fails, the requests the statement wrote are still answered, so those left
    /// pending were not written by it.
    async fn settle<O: Op>(
        &self,
        conn: &mut PgConnection,
        rounds: &mut Rounds<'_, O>,
        rows: std::result::Result<Vec<PgRow>, sqlx::Error>,
        keys: &[&Key],
    ) -> Result<(), Failure> {
        let rows = rows.map_err(|e| Failure {
            // The server reports a statement it aborted (rolled back); anything else (a
            // connection lost mid-statement) leaves what it wrote unknown.
            unknown: !matches!(e, sqlx::Error::Database(_)),
            error: backend(e),
        })?;
        match self.with_unwritten(conn, &rows, keys).await {
            Ok(read) => rounds.apply(read).map_err(Failure::known),
            Err(error) => match StatementRows::decode(&rows, keys.iter().copied()) {
                Ok(written) => {
                    rounds.apply_written(&written);
                    Err(Failure::known(error))
                }
                Err(_) => Err(Failure {
                    error,
                    unknown: true,
                }),
            },
        }
    }

    /// One claim on its own statement (group commit off, or alone in its group).
    async fn claim_alone(&self, request: &ClaimRequest) -> Result<Claim> {
        let mut conn = self.conn().await?;
        only(
            self.run_claims(&mut conn, std::slice::from_ref(request))
                .await?,
        )
    }

    /// One commit on its own statement (group commit off, or alone in its group).
    async fn commit_alone(&self, request: CommitRef<'_>) -> Result<()> {
        let mut conn = self.conn().await?;
        only(self.run_commits(&mut conn, &[request]).await?)
    }

    /// A group of single claims (see [`crate::group`]): one batch, in queue order. If the
    /// batch fails as a whole, each claim it did not answer runs again alone, so one
    /// request's failure never decides another's result; only when the failed statement's
    /// outcome is unknown (the connection was lost) does each unanswered request get that
    /// error, as it would have alone.
    async fn claim_group(self, requests: Vec<ClaimRequest>) -> Vec<Result<Claim>> {
        if let [one] = &requests[..] {
            return vec![self.claim_alone(one).await];
        }
        let mut conn = match self.conn().await {
            Ok(conn) => conn,
            Err(e) => return shared_error(e, requests.len()),
        };
        let mut rounds = Rounds::<ClaimOp>::new(&requests);
        let ran = self.claim_rounds(&mut conn, &mut rounds).await;
        drop(conn);
        let failure = match ran {
            Ok(()) => return rounds.finish(),
            Err(failure) => failure,
        };
        let decided = rounds.decided();
        if failure.unknown {
            return fill_undecided(decided, failure.error);
        }
        let alone = decided
            .into_iter()
            .zip(&requests)
            .map(|(decided, request)| {
                let store = &self;
                async move {
                    match decided {
                        Some(result) => result,
                        None => store.claim_alone(request).await,
                    }
                }
            });
        futures::future::join_all(alone).await
    }

    /// A group of single commits: as [`claim_group`](Self::claim_group).
    async fn commit_group(self, requests: Vec<CommitRequest>) -> Vec<Result<()>> {
        let refs: Vec<CommitRef<'_>> = requests.iter().map(CommitRef::from).collect();
        if let [one] = refs[..] {
            return vec![self.commit_alone(one).await];
        }
        let mut conn = match self.conn().await {
            Ok(conn) => conn,
            Err(e) => return shared_error(e, refs.len()),
        };
        let mut rounds = Rounds::<CommitOp<'_>>::new(&refs);
        let ran = self.commit_rounds(&mut conn, &mut rounds).await;
        drop(conn);
        let failure = match ran {
            Ok(()) => return rounds.finish(),
            Err(failure) => failure,
        };
        let decided = rounds.decided();
        if failure.unknown {
            return fill_undecided(decided, failure.error);
        }
        let alone = decided.into_iter().zip(&refs).map(|(decided, &request)| {
            let store = &self;
            async move {
                match decided {
                    Some(result) => result,
                    None => store.commit_alone(request).await,
                }
            }
        });
        futures::future::join_all(alone).await
    }
}

/// Why a run of rounds stopped.
pub(crate) struct Failure {
    /// The error.
    pub(crate) error: Error,
    /// Whether the last statement may have written requests left unanswered (its outcome
    /// is unknown); otherwise every unanswered request is as it was before the run.
    unknown: bool,
}

impl Failure {
    fn known(error: Error) -> Self {
        Failure {
            error,
            unknown: false,
        }
    }
}

/// `error` as the result of each of `n` requests (no connection for their group's
/// statement: nothing ran).
fn shared_error<T>(error: Error, n: usize) -> Vec<Result<T>> {
    fill_undecided((0..n).map(|_| None).collect(), error)
}

/// The results decided, and for the others `error` (no connection for their group's
/// statement, or its outcome is unknown: what each would have got alone), shared: the same
/// error as the source of each one's.
fn fill_undecided<T>(decided: Vec<Option<Result<T>>>, error: Error) -> Vec<Result<T>> {
    let retryable = error.is_retryable();
    let shared = Arc::new(error);
    decided
        .into_iter()
        .map(|d| {
            d.unwrap_or_else(|| {
                Err(Error::backend(
                    BACKEND,
                    retryable,
                    GroupFailed(Arc::clone(&shared)),
                ))
            })
        })
        .collect()
}

/// The error of a group's statement, shared by its requests.
#[derive(Debug)]
struct GroupFailed(Arc<Error>);

impl fmt::Display for GroupFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the grouped statement holding this request failed: {}",
            self.0
        )
    }
}

impl std::error::Error for GroupFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
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
        let request = ClaimRequest::new(key.clone(), options.clone());
        let claims = if self.lazy_claims {
            &self.inner.lazy_claims
        } else {
            &self.inner.claims
        };
        match claims {
            Some(group) => {
                group
                    .submit(request, |requests| self.clone().claim_group(requests))
                    .await
            }
            None => self.claim_alone(&request).await,
        }
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
        match &self.inner.commits {
            Some(group) => {
                let request = CommitRequest {
                    lease: lease.clone(),
                    outcome: outcome.map(<[u8]>::to_vec),
                };
                group
                    .submit(request, |requests| self.clone().commit_group(requests))
                    .await
            }
            None => self.commit_alone(CommitRef { lease, outcome }).await,
        }
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

    async fn release_failed(&self, lease: &Lease, failure: &dedup_core::Failure) -> Result<()> {
        sqlx::query(self.inner.sql.release_failed.clone())
            .bind(self.now_param())
            .bind(lease.key.consumer())
            .bind(lease.key.message_id())
            .bind(lease.token.to_string())
            .bind(failure.encode())
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
            failure_causes: true,
            ..Capabilities::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use dedup_core::DedupStore;
    use sqlx::AssertSqlSafe;

    use super::*;
    use crate::GroupCommit;

    async fn store(url: &str) -> PostgresStore {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let config = PostgresConfig {
            schema: "dedup_test".into(),
            table: format!("t_group_{}", &id[..16]),
            group_commit: Some(GroupCommit {
                rounds: 1,
                max_requests: 256,
            }),
            ..PostgresConfig::default()
        };
        PostgresStore::connect_with(url, config)
            .await
            .expect("connect")
    }

    /// The transactions that wrote the table's rows now (one per grouped statement).
    async fn writers(store: &PostgresStore) -> i64 {
        let sql = format!("SELECT count(DISTINCT xmin::text) FROM {}", store.table());
        let (n,): (i64,) = sqlx::query_as(AssertSqlSafe(sql))
            .fetch_one(store.pool())
            .await
            .expect("count writers");
        n
    }

    /// Claims queued behind a running round go out as one statement (one transaction wrote
    /// all their rows), each caller with its own answer as if the claims had run one after
    /// another: of three claims of one key, one is acquired and two are `InFlight` at its
    /// attempt; then the commits of the acquired leases, queued the same way, are one
    /// statement too, and a second commit of one lease in that group is `Ok`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_claims_and_commits_share_one_statement_each() {
        let Some(url) = dedup_conformance::server_url("DEDUP_POSTGRES_URL") else {
            eprintln!("SKIPPED: DEDUP_POSTGRES_URL is not set (see scripts/test.sh)");
            return;
        };
        let store = store(&url).await;
        let options = ClaimOptions::lease(Duration::from_secs(30));
        let keys: Vec<Key> = ["a", "a", "b", "a", "c"]
            .iter()
            .map(|id| Key::new("group", *id).unwrap())
            .collect();

        let held = store.inner.claims.as_ref().unwrap().hold().await;
        let claims: Vec<_> = keys
            .iter()
            .map(|key| {
                let (store, key, options) = (store.clone(), key.clone(), options.clone());
                tokio::spawn(async move { DedupStore::claim(&store, &key, &options).await })
            })
            .collect();
        while store.inner.claims.as_ref().unwrap().queued() < keys.len() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(held);
        let mut answers = Vec::new();
        for claim in claims {
            answers.push(claim.await.unwrap().unwrap());
        }
        assert_eq!(writers(&store).await, 1, "one statement wrote every claim");
        let mut leases = Vec::new();
        let mut in_flight = 0;
        for (key, answer) in keys.iter().zip(&answers) {
            match answer {
                Claim::Acquired(lease) => {
                    assert_eq!((lease.fence, lease.attempt), (1, 1), "{key:?}");
                    leases.push(lease.clone());
                }
                Claim::InFlight { attempt, .. } => {
                    assert_eq!((key.message_id(), *attempt), ("a", 1));
                    in_flight += 1;
                }
                other => panic!("{key:?}: {other:?}"),
            }
        }
        assert_eq!((leases.len(), in_flight), (3, 2));

        leases.push(leases[0].clone());
        let held = store.inner.commits.as_ref().unwrap().hold().await;
        let commits: Vec<_> = leases
            .iter()
            .map(|lease| {
                let (store, lease) = (store.clone(), lease.clone());
                tokio::spawn(async move { DedupStore::commit(&store, &lease, Some(b"done")).await })
            })
            .collect();
        while store.inner.commits.as_ref().unwrap().queued() < leases.len() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(held);
        for commit in commits {
            commit.await.unwrap().expect("commit");
        }
        assert_eq!(writers(&store).await, 1, "one statement wrote every commit");
        for key in &keys {
            let record = DedupStore::get(&store, key)
                .await
                .unwrap()
                .expect("a record");
            assert!(
                matches!(record.state, dedup_core::RecordState::Completed { .. }),
                "{key:?}: {record:?}"
            );
        }
    }

    /// A grouped statement that fails as a whole (here: a lock timeout on one key's row,
    /// locked by a foreign transaction) decides nobody's result: the other claims of its
    /// round run again alone and are acquired; only the locked key's claim fails, with the
    /// database's retryable error, and claims normally once the lock is gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grouped_statement_that_fails_whole_lets_each_other_claim_run_alone() {
        let Some(url) = dedup_conformance::server_url("DEDUP_POSTGRES_URL") else {
            eprintln!("SKIPPED: DEDUP_POSTGRES_URL is not set (see scripts/test.sh)");
            return;
        };
        let separator = if url.contains('?') { '&' } else { '?' };
        let store = store(&format!(
            "{url}{separator}options=-c%20lock_timeout%3D300ms"
        ))
        .await;
        let options = ClaimOptions::lease(Duration::from_secs(30));
        let key = |id: &str| Key::new("grouped_failure", id).unwrap();
        // "locked" has a record, and a foreign transaction holds its row.
        let first = DedupStore::claim(&store, &key("locked"), &options)
            .await
            .unwrap();
        let Claim::Acquired(lease) = first else {
            panic!("{first:?}")
        };
        DedupStore::release(&store, &lease).await.unwrap();
        let mut blocker = store.pool().begin().await.unwrap();
        let lock = format!(
            "SELECT 1 FROM {} WHERE consumer = 'grouped_failure' AND message_id = 'locked' FOR UPDATE",
            store.table()
        );
        sqlx::query(AssertSqlSafe(lock))
            .execute(&mut *blocker)
            .await
            .unwrap();

        let held = store.inner.claims.as_ref().unwrap().hold().await;
        let ids = ["free-1", "locked", "free-2"];
        let claims: Vec<_> = ids
            .iter()
            .map(|id| {
                let (store, key, options) = (store.clone(), key(id), options.clone());
                tokio::spawn(async move { DedupStore::claim(&store, &key, &options).await })
            })
            .collect();
        while store.inner.claims.as_ref().unwrap().queued() < ids.len() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(held);
        let mut answers = Vec::new();
        for claim in claims {
            answers.push(claim.await.unwrap());
        }
        for (id, answer) in ids.iter().zip(&answers) {
            match (*id, answer) {
                ("locked", Err(e)) => assert!(e.is_retryable(), "{e}"),
                ("locked", other) => panic!("the locked key's claim: {other:?}"),
                (_, Ok(Claim::Acquired(lease))) => assert_eq!(lease.fence, 1, "{id}"),
                (_, other) => panic!("{id} was decided by another key's failure: {other:?}"),
            }
        }
        blocker.rollback().await.unwrap();
        let again = DedupStore::claim(&store, &key("locked"), &options)
            .await
            .unwrap();
        assert!(
            matches!(&again, Claim::Acquired(l) if l.fence == 2),
            "once the lock is gone: {again:?}"
        );
    }

    /// A lazy handle's claim sets `synchronous_commit = off` for its own transaction only:
    /// inside a transaction the setting reads `off` after the claim and `on` again once
    /// that transaction ended, for the single and the batch statements alike; a plain
    /// handle's claim leaves it `on`. No pool connection keeps the change afterwards.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lazy_claim_commits_asynchronously_and_only_its_own_transaction() {
        let Some(url) = dedup_conformance::server_url("DEDUP_POSTGRES_URL") else {
            eprintln!("SKIPPED: DEDUP_POSTGRES_URL is not set (see scripts/test.sh)");
            return;
        };
        let store = store(&url).await;
        let options = ClaimOptions::lease(Duration::from_secs(30));
        let request = |id: &str| ClaimRequest::new(Key::new("lazy", id).unwrap(), options.clone());
        async fn setting(conn: &mut PgConnection) -> String {
            let (value,): (String,) = sqlx::query_as("SHOW synchronous_commit")
                .fetch_one(conn)
                .await
                .expect("show");
            value
        }
        // A connection of its own: its session setting is changed below.
        let mut conn = <PgConnection as sqlx::Connection>::connect(&url)
            .await
            .unwrap();
        sqlx::query("SET synchronous_commit = on")
            .execute(&mut conn)
            .await
            .unwrap();
        let cases: [(&PostgresStore, Vec<ClaimRequest>, &str); 4] = [
            (&store, vec![request("plain")], "on"),
            (&store, vec![request("plain-1"), request("plain-2")], "on"),
            (&store.lazy_claims(), vec![request("lazy")], "off"),
            (
                &store.lazy_claims(),
                vec![request("lazy-1"), request("lazy-2")],
                "off",
            ),
        ];
        for (handle, requests, inside) in cases {
            sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
            let claims = handle.run_claims(&mut conn, &requests).await.unwrap();
            for claim in claims {
                assert!(matches!(claim, Ok(Claim::Acquired(_))), "{claim:?}");
            }
            assert_eq!(setting(&mut conn).await, inside, "{requests:?}");
            sqlx::query("COMMIT").execute(&mut conn).await.unwrap();
            assert_eq!(setting(&mut conn).await, "on", "after {requests:?}");
        }
        // And through the trait, outside any transaction (grouped or alone).
        let lazy = store.lazy_claims();
        let claim = DedupStore::claim(&lazy, &Key::new("lazy", "trait").unwrap(), &options)
            .await
            .unwrap();
        assert!(matches!(claim, Claim::Acquired(_)), "{claim:?}");
        // No pool connection kept a session-level change.
        let mut pooled = Vec::new();
        for _ in 0..store.config().max_connections {
            let mut conn = store.pool().acquire().await.unwrap();
            let (changed,): (bool,) = sqlx::query_as(
                "SELECT setting <> reset_val FROM pg_settings WHERE name = 'synchronous_commit'",
            )
            .fetch_one(&mut *conn)
            .await
            .unwrap();
            assert!(
                !changed,
                "a pool connection kept synchronous_commit changed"
            );
            pooled.push(conn);
        }
    }

    /// A caller that stops waiting while its claim is queued takes it out: it is never
    /// written, and the others' claims are.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_whose_caller_stopped_waiting_is_never_written() {
        let Some(url) = dedup_conformance::server_url("DEDUP_POSTGRES_URL") else {
            eprintln!("SKIPPED: DEDUP_POSTGRES_URL is not set (see scripts/test.sh)");
            return;
        };
        let store = store(&url).await;
        let options = ClaimOptions::lease(Duration::from_secs(30));
        let held = store.inner.claims.as_ref().unwrap().hold().await;
        let spawn = |id: &str| {
            let (store, key, options) = (
                store.clone(),
                Key::new("cancel", id).unwrap(),
                options.clone(),
            );
            tokio::spawn(async move { DedupStore::claim(&store, &key, &options).await })
        };
        let (kept, dropped, other) = (spawn("kept"), spawn("dropped"), spawn("other"));
        while store.inner.claims.as_ref().unwrap().queued() < 3 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        dropped.abort();
        assert!(dropped.await.unwrap_err().is_cancelled());
        drop(held);
        for task in [kept, other] {
            assert!(matches!(task.await.unwrap().unwrap(), Claim::Acquired(_)));
        }
        let dropped_key = Key::new("cancel", "dropped").unwrap();
        assert_eq!(DedupStore::get(&store, &dropped_key).await.unwrap(), None);
    }
}
