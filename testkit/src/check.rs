//! The guarantees checked after each case, and [`Violation`], what a broken one reports.

use std::collections::BTreeMap;
use std::fmt;

use dedup_core::{RecordState, Verdict};

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
    /// Lost: a message that is not poison was rejected: its key holds a stored failure or
    /// a dead letter, so it is never processed.
    Rejected {
        /// The message.
        message: String,
        /// What the key holds.
        verdict: String,
    },
    /// A message whose payload is poison ([`Kit::poison`](crate::Kit::poison)) was
    /// processed: its key holds a handler's outcome, not a stored failure or a dead
    /// letter.
    PoisonProcessed {
        /// The message.
        message: String,
    },
    /// Lost: an effect every message must have (see
    /// [`Kit::expect_effect`](crate::Kit::expect_effect) and
    /// [`Kit::effects_query`](crate::Kit::effects_query)) never happened. Poison messages
    /// need none.
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
            Violation::Rejected { message, verdict } => write!(
                f,
                "lost: {message} was rejected ({verdict}), but its payload is not poison"
            ),
            Violation::PoisonProcessed { message } => write!(
                f,
                "poison: {message}'s payload is poison, yet its key was processed (reject it: store a failure or dead-letter it)"
            ),
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
    /// The application's counts of effects in its own tables, by effect, then by message
    /// id.
    pub(crate) queried: Vec<(&'a str, BTreeMap<String, usize>)>,
    /// Whether each message's payload is poison.
    pub(crate) poison: &'a [bool],
}

/// What the checks found: the violations, and how many repeated effects lease mode
/// excused (for the report).
pub(crate) struct Checked {
    pub(crate) violations: Vec<Violation>,
    pub(crate) excused: usize,
}

/// Check a drained case.
pub(crate) async fn check(world: &World, expect: Expectations<'_>) -> Checked {
    let mut violations = Vec::new();
    let mut excused_total = 0;
    let mut verdicts = Vec::new();
    for m in 0..world.messages.len() {
        let verdict = match world.store.get(&world.key(m)).await {
            Ok(Some(r)) => match r.state {
                RecordState::Completed { outcome, .. } => Some(Verdict::decode(outcome)),
                RecordState::InFlight { .. } => None,
            },
            _ => None,
        };
        verdicts.push(verdict);
    }
    let st = world.lock();
    for (m, message) in world.messages.iter().enumerate() {
        let name = message.name();
        let poison = expect.poison.get(m).copied().unwrap_or(false);
        match (&verdicts[m], poison) {
            (None, _) => violations.push(Violation::NotProcessed {
                message: name.clone(),
            }),
            (Some(Verdict::Processed(_)), true) => violations.push(Violation::PoisonProcessed {
                message: name.clone(),
            }),
            (Some(Verdict::Failed { message: why, .. }), false) => {
                violations.push(Violation::Rejected {
                    message: name.clone(),
                    verdict: format!("a stored failure: {why}"),
                })
            }
            (Some(Verdict::DeadLetter { attempts, .. }), false) => {
                violations.push(Violation::Rejected {
                    message: name.clone(),
                    verdict: format!("a dead letter after {attempts} attempts"),
                })
            }
            _ => {}
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
            if !poison && !mine.iter().any(|e| &e.name == effect) {
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
        // Lease mode, counted effects (no time of their own): one repeat per run that
        // started its handler and was interrupted.
        let allowed = match expect.mode {
            Mode::Tx => 0,
            Mode::Lease => st
                .runs
                .iter()
                .filter(|r| r.message == m && r.entered && interrupted_anywhere(r))
                .count(),
        };
        for (effect, counts) in &expect.queried {
            let times = counts.get(message.id()).copied().unwrap_or(0);
            if times == 0 && !poison {
                violations.push(Violation::EffectMissing {
                    message: name.clone(),
                    effect: (*effect).to_owned(),
                });
            }
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
