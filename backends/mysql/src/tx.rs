//! The transactional extension: claim and commit inside the caller's own transaction.

use dedup_core::backend::transition::{self, Write};
use dedup_core::{Error, Fingerprint, Key, Lease, Result, TxClaim};
use sqlx::{AssertSqlSafe, MySqlConnection};

use crate::MySqlStore;
use crate::error::{backend, raced};
use crate::store::{ReadError, fingerprint_param};

/// How many times a transactional claim runs its statement again when the record changed
/// between the statement and the read that follows it (a lease expiring in between).
const TX_CLAIM_TRIES: u32 = 16;

impl MySqlStore {
    /// Claim `key` inside the caller's transaction (`&mut *tx` of a
    /// `sqlx::Transaction<'_, MySql>`), so the inbox row commits or rolls back with the
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
    /// The claim is one `INSERT ... ON DUPLICATE KEY UPDATE` (which never raises a
    /// duplicate key, so the transaction stays usable and can commit): it inserts the
    /// completed record, or takes over an expired lease, and says which in the statement's
    /// insert id. Only a duplicate it left alone is read again (locked), to answer. A
    /// concurrent transaction claiming the same key waits on the row until this one ends,
    /// then sees `Completed` (commit) or claims (rollback). Neither statement takes a gap
    /// lock (the insert locks only its own key, the read only the row that exists), so
    /// concurrent claims of neighbouring keys do not deadlock, at READ COMMITTED and at
    /// REPEATABLE READ (MySQL's default) alike.
    ///
    /// Locks: the key's row stays locked until the transaction ends, also for a duplicate;
    /// keep such transactions short. One statement when it claims, two for a duplicate.
    pub async fn claim_in_tx(
        &self,
        conn: &mut MySqlConnection,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
    ) -> Result<TxClaim> {
        let now = self.now_param();
        for _ in 0..TX_CLAIM_TRIES {
            let done = sqlx::query(AssertSqlSafe(self.statements().claim_in_tx.clone()))
                .bind(key.consumer())
                .bind(key.message_id())
                .bind(now)
                .bind(now)
                .bind(fingerprint_param(fingerprint))
                .bind(now)
                .execute(&mut *conn)
                .await
                .map_err(backend)?;
            // 1: inserted (fence 1); 2 or more: an expired lease taken over, at that
            // fence; 0: a duplicate left as it was (see `Statements::new`).
            match done.last_insert_id() {
                0 => {}
                fence => return Ok(TxClaim::Claimed { fence }),
            }
            let (now, found, last_id) = match self.read_noting(conn, &[key], true).await {
                Ok(read) => read,
                Err(ReadError::Sql(e)) => return Err(backend(e)),
                Err(ReadError::Contract(e)) => return Err(e),
            };
            // A trigger (kept counts) makes the server report 0 for every statement; the
            // session's value, read with the record, says what the statement did.
            if let Some(fence) = last_id.filter(|id| *id != 0) {
                return Ok(TxClaim::Claimed { fence });
            }
            let Some((_, stored)) = found.into_iter().next() else {
                // Removed in between (an operator's forget with force): claim again.
                continue;
            };
            match transition::tx_claim(Some(&stored.record), key, fingerprint, now)? {
                (answer, Write::Unchanged) => return Ok(answer),
                // The statement saw a live lease that has expired since: run it again.
                (_, Write::Put(_)) => continue,
            }
        }
        Err(raced("transactional claim"))
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
        conn: &mut MySqlConnection,
        lease: &Lease,
        outcome: Option<&[u8]>,
    ) -> Result<()> {
        dedup_core::backend::check::commit(outcome)?;
        let key = &lease.key;
        let done = sqlx::query(self.statements().commit_in_tx.clone())
            .bind(self.now_param())
            .bind(outcome)
            .bind(key.consumer())
            .bind(key.message_id())
            .bind(lease.token.to_string())
            .execute(&mut *conn)
            .await
            .map_err(backend)?;
        // sqlx counts matched rows (CLIENT_FOUND_ROWS): the row was in flight under this
        // token and is now completed by it, and locked until the transaction ends.
        if done.rows_affected() == 1 {
            return Ok(());
        }
        // The row as it is now: completed by this token means committed by an earlier
        // call; anything else is a lost lease.
        let (now, found) = match self.read(conn, &[key], true).await {
            Ok(read) => read,
            Err(ReadError::Sql(e)) => return Err(backend(e)),
            Err(ReadError::Contract(e)) => return Err(e),
        };
        let record = found.into_iter().next().map(|(_, s)| s.record);
        match transition::commit(record.as_ref(), lease, outcome, now)? {
            Write::Unchanged => Ok(()),
            // Still held by this token after the update: cannot happen, the update matched
            // exactly that.
            Write::Put(_) => Err(Error::lease_lost(key)),
        }
    }
}
