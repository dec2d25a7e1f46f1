//! The transactional extension: claiming and committing inside the caller's own rusqlite
//! transaction, next to the caller's business writes.

use dedup_core::backend::transition::{self, Write};
use dedup_core::{Error, Fingerprint, Key, Lease, Result, TxClaim};
use rusqlite::{Connection, OptionalExtension, Transaction, params};

use crate::connect::{Location, Wait};
use crate::decode;
use crate::error::backend;
use crate::store::SqliteStore;

impl SqliteStore {
    /// Claim `key` inside the caller's transaction `tx`: the inbox row commits or rolls back
    /// with the caller's business rows.
    ///
    /// - absent: a *completed* row is written (no lease, fence 1) and
    ///   [`TxClaim::Claimed`] returned: do the work in the same transaction;
    /// - in flight with an expired (or released) lease: taken over in the same statement
    ///   (completed, fence+1, attempt+1): `Claimed`;
    /// - in flight with a live lease: [`TxClaim::InFlight`]; completed: [`TxClaim::Completed`]
    ///   (nothing written in either case);
    /// - a stored fingerprint different from `fingerprint`:
    ///   [`Error::FingerprintMismatch`], nothing written.
    ///
    /// A duplicate is never an error, and after any of these results `tx` stays usable.
    /// On rollback no record is left and the next delivery claims normally.
    ///
    /// Synchronous (rusqlite is): call it where the transaction lives, on a blocking thread
    /// when inside an async runtime. `tx` must be on a connection to this store's database
    /// file (see [`open_connection`](Self::open_connection)); begin it with
    /// [`TransactionBehavior::Immediate`](rusqlite::TransactionBehavior::Immediate) so it
    /// takes SQLite's write lock up front. The claim writes before it reads, so it also
    /// works as the first statement of a deferred transaction; a deferred transaction that
    /// *read* before can fail with a retryable `SQLITE_BUSY` instead of waiting (roll back
    /// and run it again). A concurrent transaction claiming the same key waits for this one
    /// (up to its busy timeout): it then sees `Completed` after a commit, or claims after a
    /// rollback. Keep such transactions short: they hold the database's write lock.
    ///
    /// "now" is the configured clock (the system clock by default), read when called.
    pub fn claim_in_tx(
        &self,
        tx: &Transaction<'_>,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
    ) -> Result<TxClaim> {
        let inner = &self.inner;
        let now = inner.clock.now();
        let claimed_fence: Option<i64> = tx
            .prepare_cached(&inner.statements.tx_claim)
            .and_then(|mut stmt| {
                stmt.query_row(
                    params![
                        key.consumer(),
                        key.message_id(),
                        now.as_millis(),
                        fingerprint.map(Fingerprint::as_str),
                    ],
                    |row| row.get(0),
                )
                .optional()
            })
            .map_err(backend)?;
        if let Some(fence) = claimed_fence {
            let fence = dedup_core::backend::fence_from(key, fence)?;
            return Ok(TxClaim::Claimed { fence });
        }
        // Nothing written: the contract says why, from the record under the lock.
        let record = decode::select(tx, &inner.statements, key)?;
        match transition::tx_claim(record.as_ref(), key, fingerprint, now)? {
            (_, Write::Put(_)) => Err(Error::corrupt(
                key,
                "the transactional claim wrote nothing where the contract says it should",
            )),
            (answer, Write::Unchanged) => Ok(answer),
        }
    }

    /// Commit `lease` (from a lease-mode [`claim`](dedup_core::DedupStore::claim)) inside the
    /// caller's transaction `tx`, with `outcome`: for work that claimed in lease mode, did
    /// slow external calls, and now writes its business rows and the commit atomically.
    ///
    /// Same results as [`DedupStore::commit`](dedup_core::DedupStore::commit): `Ok` when the
    /// lease's token holds the key in flight (expired or not) or already completed it;
    /// [`Error::LeaseLost`] otherwise, with nothing written and `tx` still usable (roll it
    /// back: the work must not become permanent). Same transaction advice as
    /// [`claim_in_tx`](Self::claim_in_tx).
    pub fn commit_in_tx(
        &self,
        tx: &Transaction<'_>,
        lease: &Lease,
        outcome: Option<&[u8]>,
    ) -> Result<()> {
        dedup_core::backend::check::commit(outcome)?;
        let inner = &self.inner;
        let now = inner.clock.now();
        inner.commit_one(tx, lease, outcome, now)?
    }

    /// A new connection to this store's database file, configured like the store's own
    /// (busy timeout, WAL, synchronous), for the caller's transactions with
    /// [`claim_in_tx`](Self::claim_in_tx) and [`commit_in_tx`](Self::commit_in_tx).
    /// Blocking (it opens a file): call it outside async code or on a blocking thread.
    ///
    /// An in-memory store has no file to share: [`Error::Unsupported`].
    pub fn open_connection(&self) -> Result<Connection> {
        match &self.inner.pool.location {
            Location::File(path) => self.inner.pool.settings.open_file(path, Wait::Full),
            Location::Memory => Err(Error::Unsupported(
                "an in-memory SqliteStore cannot share its database with another connection",
            )),
        }
    }
}
