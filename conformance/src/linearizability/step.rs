//! The sequential model: one call applied to one key's record by the contract's pure
//! functions (`dedup_core::backend::transition`, what `MemoryStore` runs), at every "now" the call
//! could have seen.

use std::time::Duration;

use dedup_core::backend::transition::{self, Write};
use dedup_core::{Claim, LeaseToken, Record, RecordState, Result, Timestamp};

use super::history::{Answer, Call, Operation};

/// The state of one key: its record, or none.
pub(crate) type State = Option<Record>;

/// Times revealed anywhere in one key's history: they are the candidates for the "now" of
/// calls whose answer does not reveal it (a commit's `processed_at`, a release's expiry).
#[derive(Debug, Default)]
pub(crate) struct Revealed {
    processed_at: Vec<Timestamp>,
    expires_at: Vec<Timestamp>,
}

impl Revealed {
    /// Collect the revealed times of `operations`.
    pub(crate) fn of<'a>(operations: impl IntoIterator<Item = &'a Operation>) -> Self {
        let mut revealed = Revealed::default();
        for op in operations {
            match &op.answer {
                Answer::Claim(Claim::Completed { processed_at, .. }) => {
                    revealed.processed_at.push(*processed_at)
                }
                Answer::Claim(Claim::InFlight { expires_at, .. }) => {
                    revealed.expires_at.push(*expires_at)
                }
                Answer::Record(Some(record)) => match &record.state {
                    RecordState::Completed { processed_at, .. } => {
                        revealed.processed_at.push(*processed_at)
                    }
                    RecordState::InFlight { expires_at, .. } => {
                        revealed.expires_at.push(*expires_at)
                    }
                },
                _ => {}
            }
        }
        for list in [&mut revealed.processed_at, &mut revealed.expires_at] {
            list.sort_unstable();
            list.dedup();
        }
        revealed
    }
}

/// The "now"s `op` may have run at, given the slack allowed around its clock window.
fn candidate_nows(op: &Operation, revealed: &Revealed, slack: Duration) -> Vec<Timestamp> {
    let lo = op.clock_window.0.saturating_sub(slack);
    let hi = op.clock_window.1.saturating_add(slack);
    let within = |t: &&Timestamp| lo <= **t && **t <= hi;
    let exact = |t: Timestamp, d: Duration| {
        let now = t.saturating_sub(d);
        if lo <= now && now <= hi {
            vec![now]
        } else {
            Vec::new() // the store's clock read a time outside the call: no linearization
        }
    };
    match (&op.call, &op.answer) {
        (Call::Claim { options, .. }, Answer::Claim(Claim::Acquired(lease))) => {
            exact(lease.expires_at, options.lease)
        }
        (Call::Renew { extend_by, .. }, Answer::Lease(lease)) => {
            exact(lease.expires_at, *extend_by)
        }
        (Call::Commit { .. }, Answer::Done) => std::iter::once(lo)
            .chain(revealed.processed_at.iter().filter(within).copied())
            .collect(),
        (Call::Release { .. }, Answer::Done) => std::iter::once(lo)
            .chain(revealed.expires_at.iter().filter(within).copied())
            .collect(),
        // Every other answer depends on "now" only through `now < expires_at` (a live
        // lease), which the earliest possible "now" satisfies whenever any does.
        _ => vec![lo],
    }
}

fn answer<T>(result: &Result<(T, Write)>, ok: impl FnOnce(&T) -> Answer) -> Answer {
    match result {
        Ok((value, _)) => ok(value),
        Err(e) => Answer::error(e),
    }
}

/// What the model does with `op` at `now` from `state`: the answer it gives and the state
/// after.
fn apply(state: &State, op: &Operation, now: Timestamp) -> (Answer, State) {
    let record = state.as_ref();
    let (answer, write) = match &op.call {
        Call::Claim { key, options } => {
            // A new lease gets the token the store handed out, so later calls with it match.
            let token = match &op.answer {
                Answer::Claim(Claim::Acquired(lease)) => lease.token,
                _ => LeaseToken::random(),
            };
            let result = transition::claim(record, key, options, now, token);
            (
                answer(&result, |c| Answer::Claim(c.clone())),
                result.map(|r| r.1),
            )
        }
        Call::Commit { lease, outcome } => {
            let result =
                transition::commit(record, lease, outcome.as_deref(), now).map(|w| ((), w));
            (answer(&result, |()| Answer::Done), result.map(|r| r.1))
        }
        Call::Renew { lease, extend_by } => {
            let result = transition::renew(record, lease, *extend_by, now);
            (
                answer(&result, |l| Answer::Lease(l.clone())),
                result.map(|r| r.1),
            )
        }
        Call::Release { lease } => {
            let result = transition::release(record, lease, now).map(|w| ((), w));
            (answer(&result, |()| Answer::Done), result.map(|r| r.1))
        }
        Call::Get { .. } => (Answer::Record(state.clone()), Ok(Write::Unchanged)),
    };
    let after = match write {
        Ok(Write::Put(record)) => Some(record),
        _ => state.clone(),
    };
    (answer, after)
}

/// Every state `op` can lead to from one of `states` while giving the answer it gave
/// (empty: the call cannot be linearized here).
pub(crate) fn successors(
    states: &[State],
    op: &Operation,
    revealed: &Revealed,
    slack: Duration,
) -> Vec<State> {
    let nows = candidate_nows(op, revealed, slack);
    let mut out: Vec<State> = Vec::new();
    for state in states {
        for &now in &nows {
            let (answer, after) = apply(state, op, now);
            if same_answer(&answer, &op.answer) && !out.contains(&after) {
                out.push(after);
            }
        }
    }
    out
}

/// Whether the model's `expected` answer is the store's `got`. A read of a store that does
/// not keep when a key was first claimed (`Capabilities::first_claim_time` false: Redis,
/// MySQL) reports `first_claimed_at: None`; the model always knows it, so it is left out of
/// the comparison exactly when the store reported none. Everything else compares whole.
fn same_answer(expected: &Answer, got: &Answer) -> bool {
    match (expected, got) {
        (Answer::Record(Some(model)), Answer::Record(Some(store)))
            if store.first_claimed_at.is_none() =>
        {
            let mut model = model.clone();
            model.first_claimed_at = None;
            model == *store
        }
        _ => expected == got,
    }
}
