//! The guarantees checked after each case, and [`Violation`], what a broken one reports.

use std::collections::BTreeMap;
use std::fmt;

use dedup_core::RecordState;

use crate::consumer::Mode;
use crate::world::{EffectRec, RunInfo, State, World};

/// A guarantee the consumer broke in a case.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// Lost: the message's key is not completed in the store after the drain.
    NotProcessed {
        /// The message (`m0`, ...).
        message: String,
    },
    /// Lost: an effect every message must have (see
    /// [`Kit::expect_effect`](crate::Kit::expect_effect) and
    /// [`Kit::effects_query`](crate::Kit::effects_query)) never happened.
    EffectMissing {
        /// The message.
        message: String,
        /// The effect's name.
        effect: String,
    },
    /// An effect happened more often than the mode allows: in transactional mode more than
    /// once; in lease mode more than once beyond the runs interrupted between that effect
    /// and their commit (and an effect made with an idempotency key is never excused).
    EffectRepeated {
        /// The message.
        message: String,
        /// The effect's name.
        effect: String,
        /// How often it happened.
        times: usize,
        /// How many of those the mode excuses.
        excused: usize,
    },
    /// The consumer never acknowledged the message.
    NeverAcked {
        /// The message.
        message: String,
    },
    /// The consumer panicked.
    Panicked {
        /// The worker.
        worker: usize,
        /// The panic's message.
        detail: String,
    },
    /// The case did not finish: a worker waited on something the kit does not control, or
    /// the deliveries were never all acknowledged.
    Stuck {
        /// What the kit saw.
        detail: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::NotProcessed { message } => {
                write!(f, "lost: {message}'s key is not completed in the store")
            }
            Violation::EffectMissing { message, effect } => {
                write!(f, "lost: {message} never got its effect {effect:?}")
            }
            Violation::EffectRepeated {
                message,
                effect,
                times,
                excused,
            } => write!(
                f,
                "repeated: effect {effect:?} happened {times} times for {message}, {excused} of them excused (only lease mode excuses a repeat: one by a run interrupted between the effect and its commit, without an idempotency key)"
            ),
            Violation::NeverAcked { message } => {
                write!(f, "lost: {message} was never acknowledged")
            }
            Violation::Panicked { worker, detail } => {
                write!(f, "w{worker}: the consumer panicked: {detail}")
            }
            Violation::Stuck { detail } => write!(f, "stuck: {detail}"),
        }
    }
}

/// What the kit checks besides the store and the acks.
pub(crate) struct Expectations<'a> {
    pub(crate) mode: Mode,
    /// Ledger effects every message must have at least once.
    pub(crate) expected: &'a [String],
    /// The application's count of an effect in its own tables, by message id.
    pub(crate) queried: Option<(&'a str, BTreeMap<String, usize>)>,
}

/// Check a drained case.
/// What the checks found: the violations, and how many repeated effects lease mode
/// excused (for the report).
pub(crate) struct Checked {
    pub(crate) violations: Vec<Violation>,
    pub(crate) excused: usize,
}

pub(crate) async fn check(world: &World, expect: Expectations<'_>) -> Checked {
    let mut violations = Vec::new();
    let mut excused_total = 0;
    let mut completed = Vec::new();
    for m in 0..world.messages.len() {
        let done = match world.store.get(&world.key(m)).await {
            Ok(Some(r)) => matches!(r.state, RecordState::Completed { .. }),
            _ => false,
        };
        completed.push(done);
    }
    let st = world.lock();
    for (m, message) in world.messages.iter().enumerate() {
        let name = message.name();
        if !completed[m] {
            violations.push(Violation::NotProcessed {
                message: name.clone(),
            });
        }
        if st.acks[m] == 0 {
            violations.push(Violation::NeverAcked {
                message: name.clone(),
            });
        }
        let mine: Vec<&EffectRec> = st
            .effects
            .iter()
            .filter(|e| e.message == m && e.applied)
            .collect();
        for effect in expect.expected {
            if !mine.iter().any(|e| &e.name == effect) {
                violations.push(Violation::EffectMissing {
                    message: name.clone(),
                    effect: effect.clone(),
                });
            }
        }
        let mut names: Vec<&str> = mine.iter().map(|e| e.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        for effect in names {
            let applied: Vec<&&EffectRec> = mine.iter().filter(|e| e.name == effect).collect();
            if applied.len() < 2 {
                continue;
            }
            let excused = match expect.mode {
                Mode::Tx => 0,
                Mode::Lease => applied.iter().filter(|e| excused(&st, e)).count(),
            };
            if applied.len() - excused >= 2 {
                violations.push(Violation::EffectRepeated {
                    message: name.clone(),
                    effect: effect.to_owned(),
                    times: applied.len(),
                    excused,
                });
            } else {
                excused_total += applied.len() - 1;
            }
        }
        if let Some((effect, counts)) = &expect.queried {
            let times = counts.get(message.id()).copied().unwrap_or(0);
            if times == 0 {
                violations.push(Violation::EffectMissing {
                    message: name.clone(),
                    effect: (*effect).to_owned(),
                });
            }
            let allowed = match expect.mode {
                Mode::Tx => 0,
                Mode::Lease => st
                    .runs
                    .iter()
                    .filter(|r| r.message == m && r.entered && interrupted_anywhere(r))
                    .count(),
            };
            if times >= 2 && times - 1 > allowed {
                violations.push(Violation::EffectRepeated {
                    message: name.clone(),
                    effect: (*effect).to_owned(),
                    times,
                    excused: allowed,
                });
            } else if times >= 2 {
                excused_total += times - 1;
            }
        }
    }
    Checked {
        violations,
        excused: excused_total,
    }
}

/// Lease mode: an effect made without an idempotency key by a run that did not complete
/// its key and was interrupted after the effect (killed, a later failure, a release).
fn excused(st: &State, e: &EffectRec) -> bool {
    let run = &st.runs[e.run];
    e.key.is_none()
        && !run.committed
        && (run.killed || run.interrupts.iter().any(|seq| *seq > e.seq))
}

/// Lease mode, effects counted in the application's tables (no time of their own): a run
/// that started its handler and did not complete its key because it was interrupted.
fn interrupted_anywhere(run: &RunInfo) -> bool {
    !run.committed && (run.killed || !run.interrupts.is_empty())
}
