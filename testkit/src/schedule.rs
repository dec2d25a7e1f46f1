//! [`Schedule`]: what the broker, the workers and the clock do in one case, and the
//! proptest strategy that generates (and shrinks) schedules.

use std::fmt;

use proptest::prelude::*;

/// One step of a [`Schedule`]. Workers and messages are numbered from 0; a step naming a
/// worker that has nothing to do (idle with an empty queue, or finished) does nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Worker `w` moves on: an idle worker takes the next delivery from the broker's queue
    /// and runs to its first stopping point; a busy one passes the stopping point it stands
    /// at (the operation there happens) and runs to the next one.
    Run(usize),
    /// Worker `w`'s process dies where it stands: the operation it stands before does not
    /// happen, nothing it would do later happens (no release, no ack), its lease runs out
    /// at the next [`Expire`](Step::Expire), and the broker delivers its unacknowledged
    /// message again. A fresh worker takes its place.
    Kill(usize),
    /// The operation worker `w` stands before fails (an injected error: the store or the
    /// external system answers an error and does nothing; a lost ack); the worker carries
    /// on with that error.
    Fail(usize),
    /// Time passes beyond the lease (the kit's clock moves): leases of live workers are
    /// renewed, as the inbox's renewal does while a handler runs; leases of dead workers
    /// run out, so the next claim of their keys is a takeover.
    Expire,
    /// The broker delivers message `m` once more (a publisher's retry, a redelivery).
    Duplicate(usize),
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Run(w) => write!(f, "run w{w}"),
            Step::Kill(w) => write!(f, "kill w{w}"),
            Step::Fail(w) => write!(f, "fail w{w}"),
            Step::Expire => f.write_str("expire leases"),
            Step::Duplicate(m) => write!(f, "duplicate m{m}"),
        }
    }
}

/// One generated case: how many messages are published (each delivered once to begin
/// with), how many concurrent workers consume them, and the steps. After the steps the
/// kit drains: workers take turns (round robin, no more kills or failures, the clock
/// moving when nothing else can) until every delivery is acknowledged.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Schedule {
    /// Distinct messages, `m0` to `m{messages-1}`.
    pub messages: usize,
    /// Concurrent workers, `w0` to `w{workers-1}`.
    pub workers: usize,
    /// The steps before the drain.
    pub steps: Vec<Step>,
}

impl Schedule {
    /// How many steps are [`Kill`](Step::Kill)s.
    pub fn kills(&self) -> usize {
        self.count(|s| matches!(s, Step::Kill(_)))
    }

    /// How many steps are [`Duplicate`](Step::Duplicate)s.
    pub fn duplicates(&self) -> usize {
        self.count(|s| matches!(s, Step::Duplicate(_)))
    }

    /// How many steps are [`Expire`](Step::Expire)s.
    pub fn expiries(&self) -> usize {
        self.count(|s| matches!(s, Step::Expire))
    }

    /// How many steps are [`Fail`](Step::Fail)s.
    pub fn failures(&self) -> usize {
        self.count(|s| matches!(s, Step::Fail(_)))
    }

    fn count(&self, f: impl Fn(&Step) -> bool) -> usize {
        self.steps.iter().filter(|s| f(s)).count()
    }

    /// The proptest strategy: 1 to `max_messages` messages, 1 to `max_workers` workers, 0
    /// to `max_steps` steps (with [`Fail`](Step::Fail) steps only if `failures`).
    /// Shrinking removes steps, turns steps into plain [`Run`](Step::Run)s and lowers the
    /// counts.
    pub fn strategy(
        max_messages: usize,
        max_workers: usize,
        max_steps: usize,
        failures: bool,
    ) -> impl Strategy<Value = Schedule> {
        let (mm, mw) = (max_messages.max(1), max_workers.max(1));
        let mut arms: Vec<(u32, BoxedStrategy<Step>)> = vec![
            (6, (0..mw).prop_map(Step::Run).boxed()),
            (1, (0..mw).prop_map(Step::Kill).boxed()),
        ];
        if failures {
            arms.push((1, (0..mw).prop_map(Step::Fail).boxed()));
        }
        arms.push((1, Just(Step::Expire).boxed()));
        arms.push((1, (0..mm).prop_map(Step::Duplicate).boxed()));
        let step = proptest::strategy::Union::new_weighted(arms);
        // Steps first: proptest shrinks a tuple's parts in order, and the counts shrink
        // best once the steps are few.
        (
            proptest::collection::vec(step, 0..=max_steps),
            1..=mm,
            1..=mw,
        )
            .prop_map(|(steps, messages, workers)| {
                // Indices were drawn below the maxima; fold them onto the counts drawn.
                Schedule {
                    messages,
                    workers,
                    steps,
                }
                .folded()
            })
    }

    /// The same schedule without message `k` (its duplicates gone, later messages one
    /// index lower); `None` for its only message.
    pub(crate) fn without_message(&self, k: usize) -> Option<Self> {
        if self.messages < 2 || k >= self.messages {
            return None;
        }
        let steps = self
            .steps
            .iter()
            .filter_map(|s| match *s {
                Step::Duplicate(m) if m == k => None,
                Step::Duplicate(m) if m > k => Some(Step::Duplicate(m - 1)),
                other => Some(other),
            })
            .collect();
        Some(Schedule {
            messages: self.messages - 1,
            workers: self.workers,
            steps,
        })
    }

    /// The same schedule with every worker and message index folded onto the counts.
    pub(crate) fn folded(mut self) -> Self {
        let (messages, workers) = (self.messages.max(1), self.workers.max(1));
        for s in &mut self.steps {
            *s = match *s {
                Step::Run(w) => Step::Run(w % workers),
                Step::Kill(w) => Step::Kill(w % workers),
                Step::Fail(w) => Step::Fail(w % workers),
                Step::Expire => Step::Expire,
                Step::Duplicate(m) => Step::Duplicate(m % messages),
            };
        }
        self
    }

    /// How big a schedule is, for "smallest first": messages + workers + steps.
    pub(crate) fn size(&self) -> usize {
        self.messages + self.workers + self.steps.len()
    }

    /// Every schedule of at most two steps with at most `messages` messages and `workers`
    /// workers and of size below `below`, smallest first (plainer steps first among
    /// equals).
    pub(crate) fn small(
        messages: usize,
        workers: usize,
        failures: bool,
        below: usize,
    ) -> Vec<Schedule> {
        let mut out = Vec::new();
        for size in 2..below {
            for m in 1..=messages {
                for w in 1..=workers {
                    let Some(len) = size.checked_sub(m + w) else {
                        continue;
                    };
                    if len > 2 {
                        continue;
                    }
                    let mut alphabet: Vec<Step> = (0..w).map(Step::Run).collect();
                    alphabet.extend((0..w).map(Step::Kill));
                    if failures {
                        alphabet.extend((0..w).map(Step::Fail));
                    }
                    alphabet.push(Step::Expire);
                    alphabet.extend((0..m).map(Step::Duplicate));
                    let mut steps_of_len: Vec<Vec<Step>> = vec![Vec::new()];
                    for _ in 0..len {
                        steps_of_len = steps_of_len
                            .iter()
                            .flat_map(|prefix| {
                                alphabet.iter().map(move |s| {
                                    let mut v = prefix.clone();
                                    v.push(*s);
                                    v
                                })
                            })
                            .collect();
                    }
                    out.extend(steps_of_len.into_iter().map(|steps| Schedule {
                        messages: m,
                        workers: w,
                        steps,
                    }));
                }
            }
        }
        out
    }

    /// Schedules one simplification away from this one, smallest first: steps removed
    /// (any run of them), one message fewer (with the steps that handled the first
    /// message, a prefix, removed too), one worker fewer, a step turned into a plain
    /// `Run`, a lower index.
    pub(crate) fn simpler(&self) -> Vec<Schedule> {
        let len = self.steps.len();
        let mut out = Vec::new();
        for size in 1..=len {
            for start in 0..=len - size {
                let mut s = self.clone();
                s.steps.drain(start..start + size);
                out.push(s);
            }
        }
        if self.messages > 1 {
            // One message fewer, with the steps that handled it gone too: a prefix, or a
            // few steps in a row anywhere.
            let fewer = |steps: Vec<Step>| {
                Schedule {
                    messages: self.messages - 1,
                    workers: self.workers,
                    steps,
                }
                .folded()
            };
            for k in 1..=len {
                out.push(fewer(self.steps[k..].to_vec()));
            }
            for size in 1..=len.min(4) {
                for start in 0..=len - size {
                    let mut steps = self.steps.clone();
                    steps.drain(start..start + size);
                    out.push(fewer(steps));
                }
            }
        }
        if self.messages > 1 {
            out.push(
                Schedule {
                    messages: self.messages - 1,
                    ..self.clone()
                }
                .folded(),
            );
        }
        if self.workers > 1 {
            out.push(
                Schedule {
                    workers: self.workers - 1,
                    ..self.clone()
                }
                .folded(),
            );
        }
        for (i, step) in self.steps.iter().enumerate() {
            let plainer = match *step {
                Step::Run(w) if w > 0 => vec![Step::Run(w - 1)],
                Step::Kill(w) | Step::Fail(w) => vec![Step::Run(w)],
                Step::Duplicate(m) if m > 0 => vec![Step::Duplicate(m - 1)],
                Step::Expire | Step::Duplicate(_) => vec![Step::Run(0)],
                _ => Vec::new(),
            };
            for p in plainer {
                let mut s = self.clone();
                s.steps[i] = p;
                out.push(s);
            }
        }
        // Smallest first (a stable sort keeps the order above among equals).
        out.sort_by_key(|s| s.steps.len() + s.messages + s.workers);
        out
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural = |n: usize, one: &str, many: &str| {
            if n == 1 {
                format!("{n} {one}")
            } else {
                format!("{n} {many}")
            }
        };
        write!(
            f,
            "{}, {}: ",
            plural(self.messages, "message", "messages"),
            plural(self.workers, "worker", "workers")
        )?;
        if self.steps.is_empty() {
            return f.write_str("no steps (the drain alone)");
        }
        for (i, s) in self.steps.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{s}")?;
        }
        Ok(())
    }
}
