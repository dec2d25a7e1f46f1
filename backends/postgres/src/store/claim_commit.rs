//! The claim and commit path on one connection: a single claim or commit tries the common
//! case first (a fresh key, a held lease: one statement returning next to nothing); else
//! requests run as rounds of statements
//! ([`crate::rounds`]: a key touched once per statement, each answer re-checked), the
//! records of the keys a statement did not write are read back on the same connection, and
//! a run stops at its first error, saying whether the last statement's outcome is known.

use dedup_core::{
    Claim, ClaimOptions, ClaimRequest, Clock, Error, Fingerprint, Key, Lease, LeaseToken, Result,
    SystemClock, Timestamp, duration_millis,
};
use dedup_sql::fresh;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use super::PostgresStore;
use crate::decode::StatementRows;
use crate::error::{MOVED_TRIES, backend, row_moved};
use crate::rounds::{ClaimOp, CommitOp, CommitRef, Op, Rounds, only};

impl PostgresStore {
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

    /// One lease-mode claim on a connection of its own. A key without a record, the common
    /// case, is one insert that returns the lease's expiry alone ([`Statements::claim_fresh`]:
    /// no takeover, no record to decode). A key with a record then has it read on the same
    /// connection and the contract applied: a duplicate is answered from that read (two
    /// statements, as the claim statement plus its read would be), and a takeover, or a
    /// record gone meanwhile, runs the claim statement in the next round (three).
    ///
    /// [`Statements::claim_fresh`]: crate::statements::Statements::claim_fresh
    pub(super) async fn claim_one(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        let mut conn = self.conn().await?;
        let token = LeaseToken::random();
        let fresh = sqlx::query(self.claim_fresh_statement().clone())
            .bind(self.now_param())
            .bind(key.consumer())
            .bind(key.message_id())
            .bind(token.to_string())
            .bind(duration_millis(options.lease))
            .bind(options.fingerprint.as_ref().map(Fingerprint::as_str))
            .fetch_optional(&mut *conn)
            .await
            .map_err(backend)?;
        if let Some(row) = fresh {
            let expires_at = row.try_get(0).map_err(backend)?;
            return Ok(fresh::acquired(
                key,
                token,
                Timestamp::from_millis(expires_at),
            ));
        }
        let request = ClaimRequest::new(key.clone(), options.clone());
        let mut rounds = Rounds::<ClaimOp>::new(std::slice::from_ref(&request));
        rounds.apply(self.with_unwritten(&mut conn, &[], &[key]).await?)?;
        self.claim_rounds(&mut conn, &mut rounds)
            .await
            .map_err(|f| f.error)?;
        only(rounds.finish())
    }

    /// One commit on a connection of its own. A lease still held by its token, the common
    /// case, is one update that returns no row ([`Statements::commit_held`]); otherwise the
    /// record is read on the same connection and the contract decides (a retried commit of
    /// the same token is Ok, anything else `LeaseLost`): two statements, as the commit
    /// statement plus its read would be.
    ///
    /// On the partitioned layout the update first names the partition of the store's
    /// "now" ([`Statements::commit_held_in`]), where a lease claimed in the same window
    /// lives: one index probe, and no lock on the other partitions. When it changes nothing
    /// (the window turned since the claim, or the lease is lost), the update over every
    /// partition runs as on the plain layout: one statement more, on that path only.
    ///
    /// [`Statements::commit_held`]: crate::statements::Statements::commit_held
    /// [`Statements::commit_held_in`]: crate::statements::Statements::commit_held_in
    pub(super) async fn commit_one(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        let mut conn = self.conn().await?;
        if let Some(first) = self.here(&self.inner.sql.commit_held_in)
            && self.commit_held(&mut conn, first, lease, outcome).await?
        {
            return Ok(());
        }
        let all = self.inner.sql.commit_held.clone();
        if self.commit_held(&mut conn, all, lease, outcome).await? {
            return Ok(());
        }
        let request = [CommitRef { lease, outcome }];
        let mut rounds = Rounds::<CommitOp<'_>>::new(&request);
        rounds.apply(self.with_unwritten(&mut conn, &[], &[&lease.key]).await?)?;
        self.commit_rounds(&mut conn, &mut rounds)
            .await
            .map_err(|f| f.error)?;
        only(rounds.finish())
    }

    /// Of a partitioned layout's statements by slot, the one of the store's clock now (the
    /// client's clock when the store uses the server's: a wrong guess only costs the
    /// fallback); `None` on the plain layout.
    fn here(&self, by_slot: &[sqlx::SqlStr]) -> Option<sqlx::SqlStr> {
        let partitions = self.inner.config.partitions.as_ref()?;
        let now = self
            .now_param()
            .unwrap_or_else(|| SystemClock.now().as_millis());
        let slot = usize::try_from(partitions.slot_at(now)).ok()?;
        by_slot.get(slot).cloned()
    }

    /// Run `statement` (a `commit_held`): whether it completed the lease. A row moved by a
    /// concurrent update is met again, at most [`MOVED_TRIES`] times.
    async fn commit_held(
        &self,
        conn: &mut PgConnection,
        statement: sqlx::SqlStr,
        lease: &Lease,
        outcome: Option<&[u8]>,
    ) -> Result<bool> {
        let mut tries = 1;
        loop {
            let done = sqlx::query(statement.clone())
                .bind(self.now_param())
                .bind(lease.key.consumer())
                .bind(lease.key.message_id())
                .bind(lease.token.to_string())
                .bind(outcome)
                .execute(&mut *conn)
                .await;
            match done {
                Err(e) if row_moved(&e) && tries < MOVED_TRIES => tries += 1,
                done => return Ok(done.map_err(backend)?.rows_affected() == 1),
            }
        }
    }

    /// Run lease-mode claims (see [`crate::rounds`]).
    pub(super) async fn run_claims(
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
    pub(super) async fn claim_rounds(
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
    /// then stay in `rounds`). On the partitioned layout, a first round of many keys names
    /// the partition of the store's clock now, as [`commit_one`](Self::commit_one) does;
    /// the keys it did not write are read, and those still held go in a round over every
    /// partition.
    pub(super) async fn commit_rounds(
        &self,
        conn: &mut PgConnection,
        rounds: &mut Rounds<'_, CommitOp<'_>>,
    ) -> Result<(), Failure> {
        let mut first = self.here(&self.inner.sql.commit_many_in);
        while let Some(round) = rounds.next_round() {
            let here = first.take();
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
                    sqlx::query(here.unwrap_or_else(|| self.inner.sql.commit_many.clone()))
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
    pub(super) async fn settle<O: Op>(
        &self,
        conn: &mut PgConnection,
        rounds: &mut Rounds<'_, O>,
        rows: std::result::Result<Vec<PgRow>, sqlx::Error>,
        keys: &[&Key],
    ) -> Result<(), Failure> {
        let rows = match rows {
            // A row moved under the statement (the partitioned layout): the server rolled
            // it back, so it wrote nothing. The read below finds each record where it is
            // now, and the rounds run again what still applies.
            Err(e) if row_moved(&e) => Vec::new(),
            rows => rows.map_err(|e| Failure {
                // The server reports a statement it aborted (rolled back); anything else (a
                // connection lost mid-statement) leaves what it wrote unknown.
                unknown: !matches!(e, sqlx::Error::Database(_)),
                error: backend(e),
            })?,
        };
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
}

/// Why a run of rounds stopped.
pub(super) struct Failure {
    /// The error.
    pub(super) error: Error,
    /// Whether the last statement may have written requests left unanswered (its outcome
    /// is unknown); otherwise every unanswered request is as it was before the run.
    pub(super) unknown: bool,
}

impl Failure {
    pub(super) fn known(error: Error) -> Self {
        Failure {
            error,
            unknown: false,
        }
    }
}

pub(super) fn consumers<'k>(keys: &[&'k Key]) -> Vec<&'k str> {
    keys.iter().map(|k| k.consumer()).collect()
}

pub(super) fn message_ids<'k>(keys: &[&'k Key]) -> Vec<&'k str> {
    keys.iter().map(|k| k.message_id()).collect()
}
