//! [`Kit`]: the builder, the proptest run, and what a run reports ([`Report`],
//! [`Failure`]).

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dedup_core::backend::names::sql_identifier;
use dedup_core::{BoxError, DedupStore, Error, InboxConfig, Key, ManualClock};
use futures::future::BoxFuture;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

use crate::check::{self, Expectations, Violation};
use crate::consumer::{Consumer, Message};
use crate::report::{Failure, Report};
use crate::run::Driver;
use crate::schedule::Schedule;
use crate::seed::{SEED_ENV, bad_seed, hex, parse_seed, random_seed, random_u64};
use crate::setup::{Cleanups, Rig, Setup};
use crate::world::World;

/// The most runs spent simplifying a schedule proptest shrank.
const MINIMIZE_RUNS: usize = 2_000;

/// The most runs spent looking for a counter-example of at most two steps.
const SMALL_RUNS: usize = 400;

/// The renewal interval the kit gives inboxes: never, within a run (the kit renews live
/// workers' leases itself when it moves the clock).
const NO_RENEWAL: Duration = Duration::from_secs(24 * 3600);

type Query = Arc<
    dyn Fn(Vec<String>) -> BoxFuture<'static, Result<BTreeMap<String, usize>, BoxError>>
        + Send
        + Sync,
>;

/// The store and the consumer a run tests (what a [`Kit::run_with`] setup returns).
pub struct Subject<C> {
    /// The store under test, as the inbox uses it. The kit gives each worker a view of it
    /// that stops at every operation, and reads it (without stopping) for its checks.
    pub store: Arc<dyn DedupStore>,
    /// The consumer.
    pub consumer: C,
}

impl<C> fmt::Debug for Subject<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subject").finish_non_exhaustive()
    }
}

/// A property test of an application's consumer: generates schedules (messages, duplicate
/// deliveries, concurrent workers, kills, injected failures, expiring leases), runs the
/// consumer under each, checks that nothing is lost and no effect repeats beyond what the
/// mode allows, and on failure shrinks to the smallest schedule and tells its story.
///
/// Defaults: 256 cases; up to 3 messages, 3 workers and 24 steps per case; the
/// [`InboxConfig`] default (its 30-second lease, on the kit's clock); consumer name
/// `testkit`; a [`MemoryStore`](dedup_core::MemoryStore) on the kit's clock; a fresh random seed (or
/// [`SEED_ENV`]).
#[derive(Clone)]
pub struct Kit {
    cases: u32,
    max_messages: usize,
    max_workers: usize,
    max_steps: usize,
    failures: bool,
    seed: Option<[u8; 32]>,
    config: InboxConfig,
    consumer_name: String,
    named_tables: Option<(String, String)>,
    expected: Vec<String>,
    query: Option<(String, Query)>,
}

impl fmt::Debug for Kit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kit")
            .field("cases", &self.cases)
            .field("max_messages", &self.max_messages)
            .field("max_workers", &self.max_workers)
            .field("max_steps", &self.max_steps)
            .field("config", &self.config)
            .field("expected", &self.expected)
            .finish_non_exhaustive()
    }
}

impl Default for Kit {
    fn default() -> Self {
        Self::new()
    }
}

impl Kit {
    /// A kit with the defaults above.
    pub fn new() -> Self {
        Kit {
            cases: 256,
            max_messages: 3,
            max_workers: 3,
            max_steps: 24,
            failures: true,
            seed: None,
            config: InboxConfig::default(),
            consumer_name: "testkit".to_owned(),
            named_tables: None,
            expected: Vec::new(),
            query: None,
        }
    }

    /// How many cases (schedules) to run.
    pub fn cases(mut self, cases: u32) -> Self {
        self.cases = cases.max(1);
        self
    }

    /// The most messages in a case (at least 1).
    pub fn max_messages(mut self, n: usize) -> Self {
        self.max_messages = n.max(1);
        self
    }

    /// The most concurrent workers in a case (at least 1).
    pub fn max_workers(mut self, n: usize) -> Self {
        self.max_workers = n.max(1);
        self
    }

    /// The most steps before the drain.
    pub fn max_steps(mut self, n: usize) -> Self {
        self.max_steps = n;
        self
    }

    /// Whether schedules inject failures ([`Step::Fail`](crate::Step::Fail)); on by
    /// default. Off, the kit explores kills, expiries and duplicates only.
    pub fn inject_failures(mut self, on: bool) -> Self {
        self.failures = on;
        self
    }

    /// Replay a run: the seed a failure printed (64 hex digits); anything else is
    /// [`Error::InvalidInput`].
    pub fn seed(mut self, hex: &str) -> Result<Self, Error> {
        self.seed = Some(parse_seed(hex).ok_or_else(|| bad_seed(hex))?);
        Ok(self)
    }

    /// The inbox configuration (lease, attempt limit, failure policy) the consumer runs
    /// with. The kit turns the renewal timer off (it renews live workers' leases when it
    /// moves the clock), turns its retention purge off, and moves the clock by `lease` +
    /// 1 ms to expire leases.
    pub fn inbox_config(mut self, config: InboxConfig) -> Self {
        self.config = config;
        self
    }

    /// The consumer name of the keys (`Key::new(name, message id)`); a name a [`Key`]
    /// refuses is [`Error::InvalidInput`].
    pub fn consumer_name(mut self, name: &str) -> Result<Self, Error> {
        Key::new(name, "m")?;
        self.consumer_name = name.to_owned();
        Ok(self)
    }

    /// Run on the tables `inbox` and `outbox` instead of the kit's own: an explicit opt-in,
    /// for a copy of your service's schema (never the live tables a running service or its
    /// relay reads: the kit's clock runs hours ahead, and the kit's messages would be
    /// relayed). [`Setup::sqlite`] and [`Setup::postgres`] open the store on them; the kit
    /// does not drop them after the run. Names that are not safe SQL identifiers (ASCII
    /// letters, digits and `_`, at most 63 bytes), or twice the same name, are
    /// [`Error::InvalidInput`].
    pub fn named_tables(mut self, inbox: &str, outbox: &str) -> Result<Self, Error> {
        sql_identifier("inbox table", inbox)?;
        sql_identifier("outbox table", outbox)?;
        if inbox == outbox {
            return Err(Error::invalid(
                "outbox table",
                format!("{outbox:?} is also the inbox table"),
            ));
        }
        self.named_tables = Some((inbox.to_owned(), outbox.to_owned()));
        Ok(self)
    }

    /// Every message must get the ledger effect `name` at least once (nothing lost).
    pub fn expect_effect(mut self, name: &str) -> Self {
        self.expected.push(name.to_owned());
        self
    }

    /// An effect the application keeps in its own tables: `count` gets the case's message
    /// ids and answers how many times the effect happened for each (a `SELECT ... GROUP BY`
    /// over its tables). Every message must have it at least once; how often it may
    /// repeat follows the mode.
    pub fn effects_query<F, Fut>(mut self, name: &str, count: F) -> Self
    where
        F: Fn(Vec<String>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<BTreeMap<String, usize>, BoxError>> + Send + 'static,
    {
        let query: Query = Arc::new(move |ids| Box::pin(count(ids)));
        self.query = Some((name.to_owned(), query));
        self
    }

    /// The inbox configuration the kit runs with (renewal timer and retention purge off:
    /// a purge would be a store operation outside the schedule).
    pub fn config(&self) -> InboxConfig {
        InboxConfig {
            renew_every: Some(NO_RENEWAL),
            retention: None,
            ..self.config.clone()
        }
    }

    /// [`run`](Self::run), panicking with the failure's story: for `#[test]`s.
    pub fn check<C: Consumer>(self, consumer: C) -> Report {
        self.run(consumer).unwrap_or_else(|f| panic!("{f}"))
    }

    /// [`run_with`](Self::run_with), panicking with the failure's story.
    pub fn check_with<C, F, Fut>(self, setup: F) -> Report
    where
        C: Consumer,
        F: FnOnce(Setup) -> Fut,
        Fut: Future<Output = Result<Subject<C>, BoxError>>,
    {
        self.run_with(setup).unwrap_or_else(|f| panic!("{f}"))
    }

    /// Run `consumer` on a [`MemoryStore`](dedup_core::MemoryStore) on the kit's clock.
    pub fn run<C: Consumer>(self, consumer: C) -> Result<Report, Box<Failure>> {
        self.run_with(|setup| async move {
            Ok(Subject {
                store: Arc::new(setup.memory_store()) as Arc<dyn DedupStore>,
                consumer,
            })
        })
    }

    /// Run the consumer and store `setup` builds, on the kit's runtime (a current-thread
    /// tokio runtime: build connection pools there), from the kit's [`Setup`]: its clock
    /// (so expiring leases is the kit's to decide) and its own tables, fresh per run and
    /// dropped after it. Build the store with [`Setup::sqlite`], [`Setup::postgres`] or
    /// [`Setup::memory_store`]. Every case runs against this one store (message ids are
    /// unique per case), so your service's database works: the kit's tables sit beside
    /// the service's, which it never writes.
    ///
    /// Panics if `setup` fails (the test cannot run); what it created is dropped first.
    pub fn run_with<C, F, Fut>(self, setup: F) -> Result<Report, Box<Failure>>
    where
        C: Consumer,
        F: FnOnce(Setup) -> Fut,
        Fut: Future<Output = Result<Subject<C>, BoxError>>,
    {
        let started = Instant::now();
        let rig = Rig {
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("dedup-testkit: a tokio runtime"),
            cleanups: Cleanups::default(),
        };
        let clock = Arc::new(ManualClock::starting_now());
        let nonce = nonce();
        let (tables, owned) = match &self.named_tables {
            Some(named) => (named.clone(), false),
            None => (own_tables(&nonce), true),
        };
        let subject = rig
            .runtime
            .block_on(setup(Setup::new(
                Arc::clone(&clock),
                tables,
                owned,
                rig.cleanups.clone(),
            )))
            .unwrap_or_else(|e| panic!("dedup-testkit: the setup failed: {e}"));
        let mut consumer = subject.consumer;
        let config = self.config();
        consumer.configure(&config);
        let bench = Bench {
            clock,
            store: subject.store,
            consumer: Arc::new(consumer),
            config,
            kit: self.clone(),
            nonce,
            cases: AtomicU64::new(0),
            rig,
        };
        let seed = match (self.seed, std::env::var(SEED_ENV)) {
            (Some(s), _) => s,
            (None, Ok(hex)) if !hex.trim().is_empty() => parse_seed(&hex)
                .unwrap_or_else(|| panic!("dedup-testkit: {SEED_ENV}: {}", bad_seed(&hex))),
            (None, _) => random_seed(),
        };
        let mut runner = TestRunner::new_with_rng(
            Config {
                cases: self.cases,
                failure_persistence: None,
                ..Config::default()
            },
            TestRng::from_seed(RngAlgorithm::ChaCha, &seed),
        );
        let strategy = Schedule::strategy(
            self.max_messages,
            self.max_workers,
            self.max_steps,
            self.failures,
        );
        let tally = std::sync::Mutex::new((BTreeMap::new(), BTreeMap::new(), 0));
        let result = runner.run(&strategy, |schedule| {
            let ran = bench.case(&schedule);
            {
                let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
                for k in &ran.kills_at {
                    *t.0.entry(k.clone()).or_insert(0) += 1;
                }
                for f in &ran.failures_at {
                    *t.1.entry(f.clone()).or_insert(0) += 1;
                }
                t.2 += ran.excused;
            }
            if ran.violations.is_empty() {
                Ok(())
            } else {
                Err(TestCaseError::fail(
                    ran.violations
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; "),
                ))
            }
        });
        let cases_run = bench.cases.load(Ordering::SeqCst);
        let (kills, failures, excused_repeats) =
            tally.into_inner().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(()) => Ok(Report {
                cases: self.cases,
                runs: cases_run,
                seed: hex(&seed),
                elapsed: started.elapsed(),
                kills,
                failures,
                excused_repeats,
            }),
            Err(TestError::Fail(reason, schedule)) => {
                // proptest shrinks a tuple's parts once each, in order; finish the job
                // greedily (runs take milliseconds), then run the result once more for
                // its story.
                let schedule = bench.minimize(schedule);
                let again = bench.case(&schedule);
                Err(Box::new(Failure {
                    seed: hex(&seed),
                    reproduced: !again.violations.is_empty(),
                    violations: again.violations,
                    reason: reason.message().to_owned(),
                    schedule,
                    story: again.story,
                    mode: bench.consumer.mode(),
                    elapsed: started.elapsed(),
                }))
            }
            Err(TestError::Abort(reason)) => {
                panic!("dedup-testkit: proptest aborted the run: {reason}")
            }
        }
    }
}

/// What one run of a case produced.
struct Ran {
    violations: Vec<Violation>,
    excused: usize,
    story: Vec<String>,
    kills_at: Vec<String>,
    failures_at: Vec<String>,
}

/// Everything a run's cases share.
struct Bench {
    clock: Arc<ManualClock>,
    store: Arc<dyn DedupStore>,
    consumer: Arc<dyn Consumer>,
    config: InboxConfig,
    kit: Kit,
    nonce: String,
    cases: AtomicU64,
    /// Last: the store and the consumer (connection pools) drop while its runtime still
    /// runs, then it drops the kit's tables.
    rig: Rig,
}

impl Bench {
    /// Take any simpler schedule that still fails, until none does.
    fn minimize(&self, mut schedule: Schedule) -> Schedule {
        let mut budget = MINIMIZE_RUNS;
        'simpler: loop {
            for candidate in schedule.simpler() {
                if budget == 0 {
                    break 'simpler;
                }
                budget -= 1;
                if !self.case(&candidate).violations.is_empty() {
                    schedule = candidate;
                    continue 'simpler;
                }
            }
            break;
        }
        // A greedy pass can stop in a local minimum (a smaller counter-example needs two
        // changes at once); every schedule of at most two steps, smallest first, finds the
        // tiny ones.
        let mut budget = SMALL_RUNS;
        for candidate in Schedule::small(
            schedule.messages,
            schedule.workers,
            self.kit.failures,
            schedule.size(),
        ) {
            if budget == 0 {
                break;
            }
            budget -= 1;
            if !self.case(&candidate).violations.is_empty() {
                return candidate;
            }
        }
        schedule
    }

    fn case(&self, schedule: &Schedule) -> Ran {
        let n = self.cases.fetch_add(1, Ordering::SeqCst);
        let prefix = format!("{}-{n}", self.nonce);
        let messages: Vec<Message> = (0..schedule.messages)
            .map(|i| Message::new(&prefix, i))
            .collect();
        let world = Arc::new(World::new(
            Arc::clone(&self.clock),
            Arc::clone(&self.store),
            self.config.clone(),
            self.kit.consumer_name.clone(),
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
            if let Some(violation) = halted {
                driver.abort();
                let st = world.lock();
                return Ran {
                    violations: vec![violation],
                    excused: 0,
                    story: st.story.clone(),
                    kills_at: st.kills_at.clone(),
                    failures_at: st.failures_at.clone(),
                };
            }
            let queried = match &self.kit.query {
                Some((name, count)) => {
                    let ids = world.messages.iter().map(|m| m.id().to_owned()).collect();
                    match count(ids).await {
                        Ok(counts) => Some((name.as_str(), counts)),
                        Err(e) => panic!("dedup-testkit: the effects query failed: {e}"),
                    }
                }
                None => None,
            };
            let checked = check::check(
                &world,
                Expectations {
                    mode: self.consumer.mode(),
                    expected: &self.kit.expected,
                    queried,
                },
            )
            .await;
            let st = world.lock();
            Ran {
                violations: checked.violations,
                excused: checked.excused,
                story: st.story.clone(),
                kills_at: st.kills_at.clone(),
                failures_at: st.failures_at.clone(),
            }
        })
    }
}

/// The kit's own tables for the run tagged `nonce`: `dedup_testkit_<nonce>` and that plus
/// `_outbox`, both checked as SQL identifiers.
fn own_tables(nonce: &str) -> (String, String) {
    let inbox = format!("dedup_testkit_{nonce}");
    let outbox = format!("{inbox}_outbox");
    for (what, name) in [("inbox table", &inbox), ("outbox table", &outbox)] {
        sql_identifier(what, name)
            .unwrap_or_else(|e| panic!("dedup-testkit: the kit's own {what}: {e}"));
    }
    (inbox, outbox)
}

/// A tag unique to this run, so cases of several runs against one database never share a
/// message id.
fn nonce() -> String {
    format!("{:012x}", random_u64() & 0xffff_ffff_ffff)
}
