//! Running claims and commits as statements that each touch a key at most once, while
//! keeping the contract's meaning "the single operations, in order".
//!
//! A statement cannot change one row twice (`ON CONFLICT DO UPDATE command cannot affect
//! row a second time`), and a batch may repeat a key. So each round sends the *first*
//! pending request of every key, in key order. The row a statement returns per key is the
//! record after that request; the later requests of the key are answered from it with
//! [`dedup_core::backend::transition`] (the contract as pure functions) as long as they would not
//! write. A later request that would write (a takeover after a fingerprint mismatch, a
//! second lease's commit) waits for the next round. In the usual batch, with distinct keys,
//! there is exactly one round: one statement.
//!
//! The same step also catches a race of READ COMMITTED: when a statement did not write, the
//! row it returns is its snapshot, which may predate a concurrent writer that the
//! statement's `ON CONFLICT` / `UPDATE` saw (it waited for it, then found nothing to do).
//! If the contract says the request should have written on that snapshot, the snapshot is
//! stale and the request simply runs again in the next round, with a fresh snapshot.

use std::collections::{BTreeMap, VecDeque};
use std::marker::PhantomData;

use dedup_core::backend::transition::{self, Write};
use dedup_core::{
    Claim, ClaimRequest, CommitRequest, Error, Fingerprint, Key, Lease, LeaseToken, Record,
    RecordState, Result, Timestamp, TxClaim,
};

use crate::decode::StatementRows;
use crate::error::raced;

/// Rounds in a row without progress before giving up with a retryable error (each such
/// round means another writer changed the key between our snapshot and our write).
const MAX_IDLE_ROUNDS: u32 = 16;

/// What the contract says a request does to a record.
pub(crate) enum Step<T> {
    /// The answer, without writing.
    Done(Result<T>),
    /// It writes: only a statement can do that.
    Writes,
}

impl<T> Step<T> {
    fn from_transition(result: Result<(T, Write)>) -> Self {
        match result {
            Ok((_, Write::Put(_))) => Step::Writes,
            Ok((value, Write::Unchanged)) => Step::Done(Ok(value)),
            Err(e) => Step::Done(Err(e)),
        }
    }
}

/// One kind of keyed request run in rounds.
pub(crate) trait Op {
    /// The request.
    type Req;
    /// Its result.
    type Out;
    /// What the operation is called in errors.
    const NAME: &'static str;
    /// The key it acts on.
    fn key(req: &Self::Req) -> &Key;
    /// The result of a request whose statement wrote `record`.
    fn written(req: &Self::Req, record: &Record) -> Result<Self::Out>;
    /// The contract applied to `record` (the key's current record) at `now`.
    fn step(record: Option<&Record>, req: &Self::Req, now: Timestamp) -> Step<Self::Out>;
}

/// The state of a batch being run in rounds.
pub(crate) struct Rounds<'r, O: Op> {
    requests: &'r [O::Req],
    /// Pending request indexes per key, in request order; keys in byte order.
    pending: BTreeMap<&'r Key, VecDeque<usize>>,
    results: Vec<Option<Result<O::Out>>>,
    idle_rounds: u32,
}

impl<'r, O: Op> Rounds<'r, O> {
    /// Nothing run yet.
    pub(crate) fn new(requests: &'r [O::Req]) -> Self {
        let mut pending: BTreeMap<&Key, VecDeque<usize>> = BTreeMap::new();
        for (i, req) in requests.iter().enumerate() {
            pending.entry(O::key(req)).or_default().push_back(i);
        }
        Rounds {
            requests,
            pending,
            results: requests.iter().map(|_| None).collect(),
            idle_rounds: 0,
        }
    }

    /// The requests the next statement runs (one per key, in key order), or `None` when
    /// every request has its result.
    pub(crate) fn next_round(&self) -> Option<Vec<&'r O::Req>> {
        if self.pending.is_empty() {
            return None;
        }
        Some(
            self.pending
                .values()
                .map(|queue| &self.requests[queue[0]])
                .collect(),
        )
    }

    /// Take in the rows of the statement that ran [`next_round`](Self::next_round).
    pub(crate) fn apply(&mut self, rows: StatementRows) -> Result<()> {
        // No row at all means no key had a record; the contract's answer for an absent
        // record does not depend on "now" (a claim writes, a commit is LeaseLost).
        let now = rows.now.unwrap_or(Timestamp::EPOCH);
        let mut progress = false;
        let requests = self.requests;
        self.pending.retain(|key, queue| {
            let first = queue[0];
            let row = rows.by_key.get(*key);
            // The record after this request: the written one, or the stored one unchanged.
            let current = row.map(|r| &r.record);
            match row {
                Some(row) if row.wrote => {
                    self.results[first] = Some(O::written(&requests[first], &row.record));
                }
                _ => match O::step(current, &requests[first], now) {
                    Step::Done(result) => self.results[first] = Some(result),
                    // A stale snapshot: run it again.
                    Step::Writes => return true,
                },
            }
            progress = true;
            queue.pop_front();
            while let Some(&next) = queue.front() {
                match O::step(current, &requests[next], now) {
                    Step::Done(result) => {
                        self.results[next] = Some(result);
                        queue.pop_front();
                    }
                    Step::Writes => break,
                }
            }
            !queue.is_empty()
        });
        if progress {
            self.idle_rounds = 0;
        } else {
            self.idle_rounds += 1;
            if self.idle_rounds >= MAX_IDLE_ROUNDS {
                return Err(raced(O::NAME));
            }
        }
        Ok(())
    }

    /// Take in only the rows the statement that ran [`next_round`](Self::next_round)
    /// wrote (the read of the others failed): the requests written are answered, every
    /// other request stays pending.
    pub(crate) fn apply_written(&mut self, rows: &StatementRows) {
        let requests = self.requests;
        self.pending.retain(|key, queue| {
            let first = queue[0];
            match rows.by_key.get(*key) {
                Some(row) if row.wrote => {
                    self.results[first] = Some(O::written(&requests[first], &row.record));
                    queue.pop_front();
                    !queue.is_empty()
                }
                _ => true,
            }
        });
    }

    /// The results decided so far, in request order (`None`: not yet), for a run that
    /// stopped on an error.
    pub(crate) fn decided(self) -> Vec<Option<Result<O::Out>>> {
        self.results
    }

    /// The results, in request order (call when [`next_round`](Self::next_round) is `None`).
    pub(crate) fn finish(self) -> Vec<Result<O::Out>> {
        self.results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(raced(O::NAME))))
            .collect()
    }
}

/// The result of a run of one request.
pub(crate) fn only<T>(mut results: Vec<Result<T>>) -> Result<T> {
    results
        .pop()
        .unwrap_or_else(|| Err(raced("single operation")))
}

/// Lease-mode claims.
pub(crate) struct ClaimOp;

impl Op for ClaimOp {
    type Req = ClaimRequest;
    type Out = Claim;
    const NAME: &'static str = "claim";

    fn key(req: &ClaimRequest) -> &Key {
        &req.key
    }

    fn written(req: &ClaimRequest, record: &Record) -> Result<Claim> {
        match &record.state {
            RecordState::InFlight { token, expires_at } => Ok(Claim::Acquired(Lease {
                key: req.key.clone(),
                token: *token,
                fence: record.fence,
                attempt: record.attempt,
                expires_at: *expires_at,
            })),
            RecordState::Completed { .. } => Err(Error::Corrupt {
                key: req.key.clone(),
                detail: "a claim wrote a completed record".into(),
            }),
        }
    }

    fn step(record: Option<&Record>, req: &ClaimRequest, now: Timestamp) -> Step<Claim> {
        Step::from_transition(transition::claim(
            record,
            &req.key,
            &req.options,
            now,
            LeaseToken::random(),
        ))
    }
}

/// Lease commits.
pub(crate) struct CommitOp<'a>(PhantomData<&'a ()>);

/// A commit request, borrowed.
#[derive(Clone, Copy)]
pub(crate) struct CommitRef<'a> {
    /// The lease to commit.
    pub(crate) lease: &'a Lease,
    /// The outcome to store.
    pub(crate) outcome: Option<&'a [u8]>,
}

impl<'a> From<&'a CommitRequest> for CommitRef<'a> {
    fn from(r: &'a CommitRequest) -> Self {
        CommitRef {
            lease: &r.lease,
            outcome: r.outcome.as_deref(),
        }
    }
}

impl<'a> Op for CommitOp<'a> {
    type Req = CommitRef<'a>;
    type Out = ();
    const NAME: &'static str = "commit";

    fn key<'r>(req: &'r CommitRef<'a>) -> &'r Key {
        &req.lease.key
    }

    fn written(_: &CommitRef<'a>, _: &Record) -> Result<()> {
        Ok(())
    }

    fn step(record: Option<&Record>, req: &CommitRef<'a>, now: Timestamp) -> Step<()> {
        Step::from_transition(
            transition::commit(record, req.lease, req.outcome, now).map(|w| ((), w)),
        )
    }
}

/// Claims inside the caller's transaction (a claim whose write is a completed record).
pub(crate) struct TxClaimOp;

/// A transactional claim request: the key and the optional fingerprint.
pub(crate) struct TxClaimReq {
    /// The key to claim.
    pub(crate) key: Key,
    /// The payload's fingerprint, if the caller gave one.
    pub(crate) fingerprint: Option<Fingerprint>,
}

impl Op for TxClaimOp {
    type Req = TxClaimReq;
    type Out = TxClaim;
    const NAME: &'static str = "transactional claim";

    fn key(req: &TxClaimReq) -> &Key {
        &req.key
    }

    fn written(_: &TxClaimReq, record: &Record) -> Result<TxClaim> {
        Ok(TxClaim::Claimed {
            fence: record.fence,
        })
    }

    fn step(record: Option<&Record>, req: &TxClaimReq, now: Timestamp) -> Step<TxClaim> {
        Step::from_transition(transition::tx_claim(
            record,
            &req.key,
            req.fingerprint.as_ref(),
            now,
        ))
    }
}
