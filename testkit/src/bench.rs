//! [`Bench`]: what a run's cases share (the store, the consumer, the runtime), how one case
//! runs and is checked, and how a failing schedule is simplified further after proptest's
//! shrinking.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dedup_core::{BoxError, DedupStore, InboxConfig, ManualClock};
use futures::future::BoxFuture;

use crate::check::{self, Expectations, Violation};
use crate::consumer::{Consumer, Message};
use crate::run::Driver;
use crate::schedule::Schedule;
use crate::setup::Rig;
use crate::world::World;

/// The most runs spent simplifying a schedule proptest shrank.
const MINIMIZE_RUNS: usize = 2_000;

/// The most runs spent looking for a counter-example of at most two steps.
const SMALL_RUNS: usize = 400;

/// A registered effects query: counts per message id ([`Kit::effects_query`](crate::Kit::effects_query)).
pub(crate) type Query = Arc<
    dyn Fn(Vec<String>) -> BoxFuture<'static, Result<BTreeMap<String, usize>, BoxError>>
        + Send
        + Sync,
>;

/// Whether a payload is poison ([`Kit::poison`](crate::Kit::poison)).
pub(crate) type IsPoison = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// What every case checks, taken from the kit's settings when the run starts.
pub(crate) struct Checks {
    /// Whether schedules may fail handlers.
    pub(crate) failures: bool,
    /// Whether messages get payloads from a generator.
    pub(crate) draws_payloads: bool,
    pub(crate) poison: Option<IsPoison>,
    pub(crate) consumer_name: String,
    /// Ledger effects every message must get at least once
    /// ([`Kit::expect_effect`](crate::Kit::expect_effect)).
    pub(crate) expected: Vec<String>,
    pub(crate) queries: Vec<(String, Query)>,
}

/// What one run of a case produced.
pub(crate) struct Ran {
    pub(crate) violations: Vec<Violation>,
    pub(crate) excused: usize,
    pub(crate) story: Vec<String>,
    pub(crate) kills_at: Vec<String>,
    pub(crate) failures_at: Vec<String>,
    /// Whether each message's payload is poison.
    pub(crate) poison: Vec<bool>,
}

/// What the cases of a run add up to, for the report.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) kills: BTreeMap<String, usize>,
    pub(crate) failures: BTreeMap<String, usize>,
    pub(crate) excused: usize,
    pub(crate) poison: u64,
}

impl Tally {
    pub(crate) fn add(&mut self, ran: &Ran) {
        for k in &ran.kills_at {
            *self.kills.entry(k.clone()).or_insert(0) += 1;
        }
        for f in &ran.failures_at {
            *self.failures.entry(f.clone()).or_insert(0) += 1;
        }
        self.excused += ran.excused;
        self.poison += ran.poison.iter().filter(|p| **p).count() as u64;
    }
}

/// Everything a run's cases share.
pub(crate) struct Bench {
    pub(crate) clock: Arc<ManualClock>,
    pub(crate) store: Arc<dyn DedupStore>,
    pub(crate) consumer: Arc<dyn Consumer>,
    pub(crate) config: InboxConfig,
    pub(crate) checks: Checks,
    pub(crate) nonce: String,
    pub(crate) cases: AtomicU64,
    /// Last: the store and the consumer (connection pools) drop while its runtime still
    /// runs, then it drops the kit's tables.
    pub(crate) rig: Rig,
}

impl Bench {
    /// Take any simpler schedule that still fails, until none does. With payloads, a
    /// schedule with a message fewer is tried with each message's payload taken out
    /// (proptest keeps one payload per message, and cannot tell which message went).
    pub(crate) fn minimize(
        &self,
        mut schedule: Schedule,
        mut payloads: Vec<Vec<u8>>,
    ) -> (Schedule, Vec<Vec<u8>>) {
        let fails = |s: &Schedule, p: &[Vec<u8>]| !self.case(s, p).violations.is_empty();
        let mut budget = MINIMIZE_RUNS;
        'simpler: loop {
            for (s, p) in self.simpler(&schedule, &payloads) {
                if budget == 0 {
                    break 'simpler;
                }
                budget -= 1;
                if fails(&s, &p) {
                    (schedule, payloads) = (s, p);
                    continue 'simpler;
                }
            }
            break;
        }
        // A greedy pass can stop in a local minimum (a smaller counter-example needs two
        // changes at once); every schedule of at most two steps, smallest first, finds the
        // tiny ones.
        let small = Schedule::small(
            schedule.messages,
            schedule.workers,
            self.checks.failures,
            schedule.size(),
        );
        let schedule = small
            .into_iter()
            .take(SMALL_RUNS)
            .find(|candidate| fails(candidate, &payloads))
            .unwrap_or(schedule);
        payloads.truncate(schedule.messages);
        (schedule, payloads)
    }

    /// The candidates one simplification away: [`Schedule::simpler`]'s; with payloads,
    /// also each message taken out with its own payload, and each of those with a message
    /// fewer paired with every way to take a payload out.
    fn simpler(&self, schedule: &Schedule, payloads: &[Vec<u8>]) -> Vec<(Schedule, Vec<Vec<u8>>)> {
        let draws = self.checks.draws_payloads;
        let without = |k: usize| {
            let mut rest = payloads.to_vec();
            rest.remove(k);
            rest
        };
        let mut out = Vec::new();
        if draws {
            for k in 0..schedule.messages {
                if let Some(s) = schedule.without_message(k) {
                    out.push((s, without(k)));
                }
            }
        }
        for s in schedule.simpler() {
            if draws && s.messages < schedule.messages {
                // The last payload out first: what the schedule alone would keep.
                for k in (0..schedule.messages).rev() {
                    out.push((s.clone(), without(k)));
                }
            } else {
                out.push((s, payloads.to_vec()));
            }
        }
        out
    }

    /// Run `schedule` with message `i` carrying `payloads[i]` (empty when there is none),
    /// then check it.
    pub(crate) fn case(&self, schedule: &Schedule, payloads: &[Vec<u8>]) -> Ran {
        let n = self.cases.fetch_add(1, Ordering::SeqCst);
        let prefix = format!("{}-{n}", self.nonce);
        let messages: Vec<Message> = (0..schedule.messages)
            .map(|i| Message::new(&prefix, i, payloads.get(i).cloned().unwrap_or_default()))
            .collect();
        let poison: Vec<bool> = messages
            .iter()
            .map(|m| self.checks.poison.as_ref().is_some_and(|p| p(m.payload())))
            .collect();
        let world = Arc::new(World::new(
            Arc::clone(&self.clock),
            Arc::clone(&self.store),
            self.config.clone(),
            self.checks.consumer_name.clone(),
            messages,
            schedule.workers,
        ));
        self.rig.runtime.block_on(async {
            let mut driver = Driver::new(
                Arc::clone(&world),
                Arc::clone(&self.consumer),
                schedule.workers,
            );
            driver.run(schedule).await;
            let panicked = world.lock().panics.first().cloned();
            let halted = match (panicked, driver.stuck.take()) {
                (Some((worker, detail)), _) => Some(Violation::Panicked { worker, detail }),
                (None, Some(detail)) => Some(Violation::Stuck { detail }),
                (None, None) => None,
            };
            let (violations, excused) = match halted {
                Some(violation) => {
                    driver.abort();
                    (vec![violation], 0)
                }
                None => {
                    let queried = self.query(&world).await;
                    let checked = check::check(
                        &world,
                        Expectations {
                            mode: self.consumer.mode(),
                            expected: &self.checks.expected,
                            queried,
                            poison: &poison,
                        },
                    )
                    .await;
                    (checked.violations, checked.excused)
                }
            };
            let st = world.lock();
            Ran {
                violations,
                excused,
                story: st.story.clone(),
                kills_at: st.kills_at.clone(),
                failures_at: st.failures_at.clone(),
                poison,
            }
        })
    }

    /// Every effects query's counts for the case's messages, in the order registered.
    async fn query(&self, world: &World) -> Vec<(&str, BTreeMap<String, usize>)> {
        let ids: Vec<String> = world.messages.iter().map(|m| m.id().to_owned()).collect();
        let mut out = Vec::with_capacity(self.checks.queries.len());
        for (name, count) in &self.checks.queries {
            match count(ids.clone()).await {
                Ok(counts) => out.push((name.as_str(), counts)),
                Err(e) => panic!("dedup-testkit: the effects query {name:?} failed: {e}"),
            }
        }
        out
    }
}
