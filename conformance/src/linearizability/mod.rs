//! A linearizability checker for recorded concurrent histories of any store.
//!
//! Clause tests check the states someone thought of; this checks every state a real
//! concurrent run happened to reach. Many tasks call a store through a [`Recorder`] (see
//! [`record_workload`]), which logs each call's invocation and response instants and its
//! answer. [`check`] then looks for a linearization: an order of the calls, consistent with
//! real time (a call that returned before another was invoked comes first), in which the
//! contract's sequential model gives every answer that was actually observed. The model is
//! `dedup_core::backend::transition`, the functions `MemoryStore` runs.
//!
//! # How it searches
//!
//! The contract acts on one key at a time, so a history is linearizable exactly when each
//! key's sub-history is (Herlihy and Wing's locality): the history is partitioned by key
//! and each part is searched alone. The search is the Wing-Gong algorithm with Lowe's
//! memoization: calls are linearized depth first, in any order real time allows, and a
//! (set of calls linearized, model state) pair already explored is never explored again,
//! as in Porcupine. Each search is bounded ([`CheckOptions::max_steps`]); giving up is
//! reported, never taken as success.
//!
//! # Time
//!
//! Leases expire by the store's clock, so the model needs each call's "now". The recorder
//! stamps every call with its clock just before invocation and just after the response
//! (the store's injected clock, or the wall clock of this machine, which the local
//! PostgreSQL's `now()` and Redis's `TIME` also read): the store's "now" lies in that
//! window, widened by [`CheckOptions::clock_slack`] for the server's rounding to
//! milliseconds. The model does not guess freely inside the window:
//! - a claim that acquired, and a renewal, reveal their "now" exactly (`expires_at` minus
//!   the requested duration), which must lie in the window;
//! - a commit's `processed_at` and a release's new expiry are tried at the window's start
//!   and at every completion time / expiry that some other call of the key observed inside
//!   the window (the only values a later answer could confirm);
//! - every other answer depends on "now" only through "the lease is still live"
//!   (`now < expires_at`), which the earliest possible "now" satisfies whenever any does.
//!
//! The "now"s of successive calls are not forced to increase: a PostgreSQL statement's
//! `now()` is its transaction's start, so a statement that waited on a row lock
//! linearizes after one that started later. Takeovers by real time are therefore checked
//! as the contract states them (acquired only once the stored expiry has passed by the
//! store's clock at that call), with the only freedom the calls' own windows.
//!
//! # What it does not cover
//!
//! Batches and purge span keys and are not recorded (the [`Recorder`] refuses them). A call
//! that failed with a backend error has an unknown effect; histories containing one are
//! rejected as unusable rather than checked (record them on a healthy connection).

mod history;
mod search;
mod step;
mod workload;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use dedup_core::Key;

pub use history::{Answer, Call, History, Operation, Recorder};
pub use workload::{Workload, assert_linearizable, record_workload};

use search::Outcome;

/// How [`check`] searches.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// How far outside a call's recorded clock window the store's "now" may lie (server
    /// rounding to milliseconds). Default 2 ms.
    pub clock_slack: Duration,
    /// Search steps allowed per key before giving up. Default 2 000 000.
    pub max_steps: u64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            clock_slack: Duration::from_millis(2),
            max_steps: 2_000_000,
        }
    }
}

/// Why a history was not accepted.
#[derive(Debug)]
#[non_exhaustive]
pub enum CheckError {
    /// A call failed with a backend error, so its effect is unknown.
    Unusable {
        /// The failed call.
        operation: Box<Operation>,
    },
    /// No linearization of this key's calls exists.
    NotLinearizable {
        /// The key.
        key: Key,
        /// Its calls, by invocation time.
        operations: Vec<Operation>,
        /// The longest prefix that could be linearized (indices into `operations`).
        longest: Vec<usize>,
    },
    /// The search gave up on this key.
    GaveUp {
        /// The key.
        key: Key,
        /// How many of its calls there were.
        calls: usize,
        /// Steps taken.
        steps: u64,
    },
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::Unusable { operation } => write!(
                f,
                "unusable history: a call failed, so its effect is unknown:\n  {operation}"
            ),
            CheckError::GaveUp { key, calls, steps } => write!(
                f,
                "gave up on {key} ({calls} calls) after {steps} search steps"
            ),
            CheckError::NotLinearizable {
                key,
                operations,
                longest,
            } => {
                writeln!(f, "history of {key} is not linearizable. Its calls:")?;
                for (i, op) in operations.iter().enumerate() {
                    writeln!(f, "  #{i:<3} {op}")?;
                }
                writeln!(
                    f,
                    "The longest linearizable prefix ({} of {} calls), in order: {:?}",
                    longest.len(),
                    operations.len(),
                    longest
                )?;
                let next: Vec<usize> = (0..operations.len())
                    .filter(|i| !longest.contains(i))
                    .take(3)
                    .collect();
                write!(
                    f,
                    "No call among the rest can come next; the first of them: {next:?}"
                )
            }
        }
    }
}

impl std::error::Error for CheckError {}

/// What [`check`] found in a linearizable history.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckSummary {
    /// Keys checked.
    pub keys: usize,
    /// Calls checked.
    pub calls: usize,
    /// Claims that acquired a key another lease had held before (takeovers).
    pub takeovers: usize,
}

/// Check that `history` is linearizable with respect to the contract's sequential model.
pub fn check(history: &History, options: &CheckOptions) -> Result<CheckSummary, CheckError> {
    let mut by_key: BTreeMap<&Key, Vec<Operation>> = BTreeMap::new();
    for op in &history.operations {
        if let Answer::Failed(_) = op.answer {
            return Err(CheckError::Unusable {
                operation: Box::new(op.clone()),
            });
        }
        by_key.entry(op.call.key()).or_default().push(op.clone());
    }
    let mut summary = CheckSummary {
        keys: by_key.len(),
        calls: history.operations.len(),
        takeovers: 0,
    };
    for (key, mut operations) in by_key {
        operations.sort_by_key(|op| op.invoked);
        summary.takeovers += operations
            .iter()
            .filter(|op| matches!(&op.answer, Answer::Claim(c) if c.lease().is_some_and(|l| l.fence > 1)))
            .count();
        match search::check_key(&operations, options.clock_slack, options.max_steps) {
            Outcome::Linearizable => {}
            Outcome::Not { longest } => {
                return Err(CheckError::NotLinearizable {
                    key: key.clone(),
                    operations,
                    longest,
                });
            }
            Outcome::GaveUp { steps } => {
                return Err(CheckError::GaveUp {
                    key: key.clone(),
                    calls: operations.len(),
                    steps,
                });
            }
        }
    }
    Ok(summary)
}
