//! The fast paths of the common cases, each one autocommit statement: claims of new,
//! distinct keys, and commits by the holder of a live lease; anything else takes the
//! general path ([`MySqlStore::locked`]).

use dedup_core::{Claim, ClaimOptions, Key, Lease, LeaseToken, Result, Timestamp};
pub(super) use dedup_sql::fresh::Fast;
use dedup_sql::fresh::acquired;
use sqlx::AssertSqlSafe;
use sqlx::mysql::{MySql, MySqlArguments};
use sqlx::query::Query;

use crate::error::{backend, lost_race, raced};

use super::{MySqlStore, fingerprint_param, last_insert_id};

impl MySqlStore {
    /// The claim of one new key as one autocommit insert, the statement built once (see
    /// [`Statements::claim_fresh`](crate::statements::Statements::claim_fresh)); `General`
    /// when the key has a record.
    pub(super) async fn claim_fresh_one(
        &self,
        key: &Key,
        options: &ClaimOptions,
    ) -> Result<Fast<Claim>> {
        let token = LeaseToken::random();
        let now = self.now_param();
        let query = sqlx::query(self.inner.sql.claim_fresh_one.clone());
        let query = bind_fresh_row(query, key, options, &token, now);
        Ok(match self.insert_fresh(query).await? {
            Fast::Done(now) => Fast::Done(acquired(key, token, now.saturating_add(options.lease))),
            Fast::General => Fast::General,
        })
    }

    /// Run a fresh-key insert: the "now" it reported, or `General` when a key has a record.
    async fn insert_fresh(
        &self,
        query: Query<'_, MySql, MySqlArguments>,
    ) -> Result<Fast<Timestamp>> {
        // Boxed: sqlx's acquire future is large, and a future that awaits it inline carries
        // and copies it (as the PostgreSQL store found with callgrind).
        let mut conn = Box::pin(self.inner.pool.acquire()).await.map_err(backend)?;
        let done = match query.execute(&mut *conn).await {
            Ok(done) => done,
            // A key with a record (duplicate key), or a deadlock with a concurrent batch
            // inserting the same keys in another order: the general path decides (and
            // runs again after a lost race).
            Err(e) if lost_race(&e) => return Ok(Fast::General),
            Err(e) => return Err(backend(e)),
        };
        let now = last_insert_id(&mut conn, &done).await.map_err(backend)?;
        i64::try_from(now)
            .ok()
            .filter(|ms| *ms > 0)
            .map(|ms| Fast::Done(Timestamp::from_millis(ms)))
            .ok_or_else(|| raced("claim: the server reported no time for the insert"))
    }

    /// Claims of new, distinct keys as one autocommit insert (see
    /// [`Statements::claim_fresh`]); `General` when any key has a record or repeats.
    pub(super) async fn claim_fresh(
        &self,
        requests: &[(&Key, &ClaimOptions)],
    ) -> Result<Fast<Vec<Claim>>> {
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
            query = bind_fresh_row(query, key, options, token, now);
        }
        let Fast::Done(now) = self.insert_fresh(query).await? else {
            return Ok(Fast::General);
        };
        Ok(Fast::Done(
            requests
                .iter()
                .zip(tokens)
                .map(|((key, options), token)| {
                    acquired(key, token, now.saturating_add(options.lease))
                })
                .collect(),
        ))
    }

    /// Commits of leases on distinct keys still held by their tokens, as one autocommit
    /// update; `General` unless every one of them was.
    pub(super) async fn commit_held(
        &self,
        requests: &[(&Lease, Option<&[u8]>)],
    ) -> Result<Fast<()>> {
        let mut keys: Vec<&Key> = requests.iter().map(|(l, _)| &l.key).collect();
        keys.sort();
        keys.dedup();
        if keys.len() != requests.len() {
            return Ok(Fast::General);
        }
        let done = if let [(lease, outcome)] = requests {
            sqlx::query(self.inner.sql.commit_in_tx.clone())
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

/// The parameters of one row of a fresh-key insert, in the statements' order.
fn bind_fresh_row<'q>(
    query: Query<'q, MySql, MySqlArguments>,
    key: &'q Key,
    options: &ClaimOptions,
    token: &LeaseToken,
    now: Option<i64>,
) -> Query<'q, MySql, MySqlArguments> {
    query
        .bind(key.consumer())
        .bind(key.message_id())
        .bind(token.to_string())
        .bind(now)
        .bind(now)
        .bind(dedup_core::duration_millis(options.lease))
        .bind(fingerprint_param(options.fingerprint.as_ref()))
        .bind(now)
}
