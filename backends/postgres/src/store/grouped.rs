//! Single claims and commits: alone on a statement of their own, or taken together from
//! the group commit queues ([`crate::group`]) and run as one batch, each caller still
//! getting the answer it would have got alone.

use std::fmt;
use std::sync::Arc;

use dedup_core::{Claim, ClaimRequest, CommitRequest, Error, Result};

use sqlx::PgConnection;

use super::PostgresStore;
use super::claim_commit::Failure;
use crate::error::BACKEND;
use crate::rounds::{ClaimOp, CommitOp, CommitRef, Op, Rounds};

impl PostgresStore {
    /// One claim on its own statement (alone in its group).
    pub(super) async fn claim_alone(&self, request: &ClaimRequest) -> Result<Claim> {
        self.claim_one(&request.key, &request.options).await
    }

    /// One commit on its own statement (alone in its group).
    pub(super) async fn commit_alone(&self, request: CommitRef<'_>) -> Result<()> {
        self.commit_one(request.lease, request.outcome).await
    }

    /// A group of single claims (see [`crate::group`]): one batch, in queue order (see
    /// [`run_group`](Self::run_group)).
    pub(super) async fn claim_group(self, requests: Vec<ClaimRequest>) -> Vec<Result<Claim>> {
        self.run_group::<ClaimOp>(&requests).await
    }

    /// A group of single commits: as [`claim_group`](Self::claim_group).
    pub(super) async fn commit_group(self, requests: Vec<CommitRequest>) -> Vec<Result<()>> {
        let refs: Vec<CommitRef<'_>> = requests.iter().map(CommitRef::from).collect();
        self.run_group::<CommitOp<'_>>(&refs).await
    }

    /// A group of single requests of kind `O`: one batch, in queue order. If the batch
    /// fails as a whole, each request it did not answer runs again alone, so one request's
    /// failure never decides another's result; only when the failed statement's outcome is
    /// unknown (the connection was lost) does each unanswered request get that error, as
    /// it would have alone.
    async fn run_group<O: Grouped>(&self, requests: &[O::Req]) -> Vec<Result<O::Out>> {
        if let [one] = requests {
            return vec![O::alone(self, one).await];
        }
        let mut conn = match self.conn().await {
            Ok(conn) => conn,
            Err(e) => return shared_error(e, requests.len()),
        };
        let mut rounds = Rounds::<O>::new(requests);
        let ran = O::run_rounds(self, &mut conn, &mut rounds).await;
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
            .zip(requests)
            .map(|(decided, request)| async move {
                match decided {
                    Some(result) => result,
                    None => O::alone(self, request).await,
                }
            });
        futures::future::join_all(alone).await
    }
}

/// A kind of single request that group commit gathers: how one runs alone, and how a
/// group's rounds run on one connection.
trait Grouped: Op {
    /// One request on its own statement.
    fn alone<'a>(
        store: &'a PostgresStore,
        request: &'a Self::Req,
    ) -> impl Future<Output = Result<Self::Out>> + Send + 'a;

    /// `rounds` run to the end, or to the first error (the results decided by then stay
    /// in `rounds`).
    fn run_rounds<'a, 'r>(
        store: &'a PostgresStore,
        conn: &'a mut PgConnection,
        rounds: &'a mut Rounds<'r, Self>,
    ) -> impl Future<Output = Result<(), Failure>> + Send + 'a
    where
        Self: Sized;
}

impl Grouped for ClaimOp {
    fn alone<'a>(
        store: &'a PostgresStore,
        request: &'a ClaimRequest,
    ) -> impl Future<Output = Result<Claim>> + Send + 'a {
        store.claim_alone(request)
    }

    fn run_rounds<'a, 'r>(
        store: &'a PostgresStore,
        conn: &'a mut PgConnection,
        rounds: &'a mut Rounds<'r, Self>,
    ) -> impl Future<Output = Result<(), Failure>> + Send + 'a {
        store.claim_rounds(conn, rounds)
    }
}

impl<'c> Grouped for CommitOp<'c> {
    fn alone<'a>(
        store: &'a PostgresStore,
        request: &'a CommitRef<'c>,
    ) -> impl Future<Output = Result<()>> + Send + 'a {
        store.commit_alone(*request)
    }

    fn run_rounds<'a, 'r>(
        store: &'a PostgresStore,
        conn: &'a mut PgConnection,
        rounds: &'a mut Rounds<'r, Self>,
    ) -> impl Future<Output = Result<(), Failure>> + Send + 'a {
        store.commit_rounds(conn, rounds)
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use dedup_core::{ClaimOptions, DedupStore, Key};
    use sqlx::{AssertSqlSafe, PgConnection};

    use super::*;
    use crate::{GroupCommit, PostgresConfig};

    async fn store(url: &str) -> PostgresStore {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let config = PostgresConfig {
            schema: "dedup_test".into(),
            group_commit: Some(GroupCommit {
                rounds: 1,
                max_requests: 256,
            }),
            sql: dedup_sql::SqlSettings {
                table: format!("t_group_{}", &id[..16]),
                ..Default::default()
            },
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

    /// The claim and commit futures stay small. sqlx's pool acquire future is about
    /// 2.5 KiB; carried inline by every future that awaits a connection, it was copied at
    /// each move (a third of the client's instructions per claim+commit, by callgrind). The
    /// connection's acquire and a group's run are boxed: these sizes guard that.
    #[tokio::test]
    async fn claim_and_commit_futures_do_not_carry_the_acquire_inline() {
        let Some(url) = dedup_conformance::server_url("DEDUP_POSTGRES_URL") else {
            eprintln!("SKIPPED: DEDUP_POSTGRES_URL is not set (see scripts/test.sh)");
            return;
        };
        let store = store(&url).await;
        let key = Key::new("future_sizes", "m").unwrap();
        let request = ClaimRequest::new(key.clone(), ClaimOptions::default());
        let lease = dedup_core::Lease {
            key,
            token: dedup_core::LeaseToken::random(),
            fence: 1,
            attempt: 1,
            expires_at: dedup_core::Timestamp::EPOCH,
        };
        let commit = CommitRef {
            lease: &lease,
            outcome: None,
        };
        let group = store.inner.claims.as_ref().expect("group commit is on");
        let sizes = [
            ("conn", std::mem::size_of_val(&store.conn())),
            (
                "claim_alone",
                std::mem::size_of_val(&store.claim_alone(&request)),
            ),
            (
                "commit_alone",
                std::mem::size_of_val(&store.commit_alone(commit)),
            ),
            (
                "claim_group",
                std::mem::size_of_val(&store.clone().claim_group(vec![request.clone()])),
            ),
            (
                "submit",
                std::mem::size_of_val(
                    &group.submit(request.clone(), |r| store.clone().claim_group(r)),
                ),
            ),
        ];
        for (name, size) in sizes {
            assert!(size <= 1536, "{name}'s future is {size} bytes: {sizes:?}");
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
    /// that transaction ended, for the single, fresh-key and batch statements alike; a plain
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
        // The fresh-key statement a single claim runs first, plain and lazy.
        for (handle, id, inside) in [
            (&store, "fresh", "on"),
            (&store.lazy_claims(), "lazy-fresh", "off"),
        ] {
            sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
            let row = sqlx::query(handle.claim_fresh_statement().clone())
                .bind(handle.now_param())
                .bind("lazy")
                .bind(id)
                .bind(dedup_core::LeaseToken::random().to_string())
                .bind(30_000_i64)
                .bind(None::<&str>)
                .fetch_optional(&mut conn)
                .await
                .unwrap();
            assert!(row.is_some(), "{id}: a fresh key is inserted");
            assert_eq!(setting(&mut conn).await, inside, "{id}");
            sqlx::query("COMMIT").execute(&mut conn).await.unwrap();
            assert_eq!(setting(&mut conn).await, "on", "after {id}");
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
