//! The transactional extension: claim and commit inside the caller's own transaction.

use dedup_core::{Fingerprint, Key, Lease, Result, TxClaim};
use sqlx::PgConnection;

use crate::PostgresStore;
use crate::error::backend;
use crate::rounds::{CommitRef, Rounds, TxClaimOp, TxClaimReq, only};

impl PostgresStore {
    /// Claim `key` inside the caller's transaction (`&mut *tx` of a
    /// `sqlx::Transaction<'_, Postgres>`), so the inbox row commits or rolls back with the
    /// caller's business rows.
    ///
    /// - [`TxClaim::Claimed`]: a completed record was written (or an expired lease-mode
    ///   record taken over, fence+1); do the work in this transaction. Commit makes it
    ///   permanent; rollback leaves no record (or the taken-over lease as it was), and the
    ///   next delivery claims normally.
    /// - [`TxClaim::Completed`]: already processed; [`TxClaim::InFlight`]: a lease-mode
    ///   worker holds a live lease. Do not process.
    /// - `Err(FingerprintMismatch)`: the stored record carries another fingerprint.
    ///
    /// A duplicate never aborts the transaction (no unique violation is ever raised): it can
    /// run further statements and commit. A concurrent transaction claiming the same key
    /// waits here until this one ends, then sees `Completed` (commit) or claims (rollback).
    ///
    /// Locks: the key's row stays locked until the transaction ends, also for a duplicate
    /// (`ON CONFLICT DO UPDATE` locks the row it inspects); keep such transactions short.
    /// Use READ COMMITTED (the default): under REPEATABLE READ or SERIALIZABLE a claim that
    /// meets a concurrently committed record fails with a retryable serialization error.
    /// On a partitioned table ([`PostgresConfig::partitions`](crate::PostgresConfig::partitions))
    /// a claim under REPEATABLE READ is refused: its look-up of the partitions would read
    /// the transaction's snapshot and could miss a record committed since.
    pub async fn claim_in_tx(
        &self,
        conn: &mut PgConnection,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
    ) -> Result<TxClaim> {
        let request = [TxClaimReq {
            key: key.clone(),
            fingerprint: fingerprint.cloned(),
        }];
        let mut rounds = Rounds::<TxClaimOp>::new(&request);
        while rounds.next_round().is_some() {
            let rows = sqlx::query(self.statements().claim_in_tx.clone())
                .bind(self.now_param())
                .bind(key.consumer())
                .bind(key.message_id())
                .bind(fingerprint.map(Fingerprint::as_str))
                .fetch_all(&mut *conn)
                .await
                .map_err(backend)?;
            rounds.apply(self.with_unwritten(conn, &rows, &[key]).await?)?;
        }
        only(rounds.finish())
    }

    /// Commit `lease` inside the caller's transaction, fenced by its token: the completed
    /// record becomes visible with the caller's business rows, or not at all.
    ///
    /// For work that claimed in lease mode, made slow external calls outside any
    /// transaction, and then writes its results and the commit atomically. Returns
    /// `Err(LeaseLost)` when the token no longer holds the key (taken over after expiry,
    /// purged): roll back then. The transaction stays usable either way. Committing again
    /// a lease already committed by the same token is `Ok`.
    pub async fn commit_in_tx(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        outcome: Option<&[u8]>,
    ) -> Result<()> {
        dedup_core::backend::check::commit(outcome)?;
        only(
            self.run_commits(conn, &[CommitRef { lease, outcome }])
                .await?,
        )
    }
}
