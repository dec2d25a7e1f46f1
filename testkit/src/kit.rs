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
use proptest::strategy::{Just, SBoxedStrategy, Strategy};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

use crate::bench::{Bench, Checks, IsPoison, Query, Tally};
use crate::consumer::Consumer;
use crate::report::{Failure, Report};
use crate::schedule::Schedule;
use crate::seed::{SEED_ENV, bad_seed, hex, parse_seed, random_seed, random_u64};
use crate::setup::{Cleanups, Rig, Setup};

/// The renewal interval the kit gives inboxes: never, within a run (the kit renews live
/// workers' leases itself when it moves the clock).
const NO_RENEWAL: Duration = Duration::from_secs(24 * 3600);

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

/// A property test of an application's consumer.
///
/// The kit generates schedules: messages, duplicate deliveries, concurrent workers,
/// kills, injected failures, expiring leases. It runs the consumer under each. It checks
/// that nothing is lost, and that no effect repeats beyond what the mode allows. On a
/// failure it shrinks the schedule to the smallest one and tells its story.
///
/// The defaults:
/// - 256 cases, each with up to 3 messages, 3 workers and 24 steps;
/// - the [`InboxConfig`] default (its 30-second lease, on the kit's clock);
/// - the consumer name `testkit`;
/// - a [`MemoryStore`](dedup_core::MemoryStore) on the kit's clock;
/// - a fresh random seed, or the one in [`SEED_ENV`].
///
/// # Examples
///
/// ```
/// use dedup_testkit::{Kit, lease};
///
/// // In a #[test]: it panics with the failure's story.
/// let report = Kit::new()
///     .cases(16)
///     .expect_effect("charge") // every message must be charged
///     .check(lease(|_message, lease, fx| async move {
///         // The payment provider dedupes by the lease's idempotency key.
///         fx.call_with_key("charge", &lease.idempotency_key()).await?;
///         Ok(Some(b"charged".to_vec()))
///     }));
/// assert_eq!(report.cases, 16);
/// ```
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
    queries: Vec<(String, Query)>,
    payloads: Option<SBoxedStrategy<Vec<u8>>>,
    poison: Option<IsPoison>,
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
            .field(
                "queried",
                &self.queries.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("payloads", &self.payloads.is_some())
            .field("poison", &self.poison.is_some())
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
            queries: Vec::new(),
            payloads: None,
            poison: None,
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

    /// Replays a run, from the seed a failure printed (64 hex digits).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for anything but 64 hex digits.
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

    /// The consumer name of the keys: `Key::new(name, message id)`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a name a [`Key`] refuses.
    pub fn consumer_name(mut self, name: &str) -> Result<Self, Error> {
        Key::new(name, "m")?;
        self.consumer_name = name.to_owned();
        Ok(self)
    }

    /// Runs on the tables `inbox` and `outbox` instead of the kit's own.
    ///
    /// It is an explicit opt-in, for a copy of your service's schema. Never give it the
    /// live tables a running service or its relay reads: the kit's clock runs hours ahead,
    /// and the kit's messages would be relayed. [`Setup::sqlite`], [`Setup::postgres`] and
    /// [`Setup::mysql`] open the store on them. The kit does not drop them after the run.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a name that is not a safe SQL identifier (ASCII
    /// letters, digits and `_`, at most 63 bytes), or the same name twice.
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
    /// Expecting a name twice is expecting it once.
    ///
    /// # Panics
    ///
    /// If `name` is already an [`effects_query`](Self::effects_query)'s: a violation
    /// naming it could not say which of the two broke.
    pub fn expect_effect(mut self, name: &str) -> Self {
        if let Err(e) = self.name_is_free(name, "expect_effect") {
            panic!("dedup-testkit: {e}");
        }
        if !self.expected.iter().any(|e| e == name) {
            self.expected.push(name.to_owned());
        }
        self
    }

    /// An effect the application keeps in its own tables: `count` gets the case's message
    /// ids and answers how many times the effect happened for each (a `SELECT ... GROUP BY`
    /// over its tables). Every message must have it at least once; how often it may
    /// repeat follows the mode. Register as many as the handler has effects: the kit runs
    /// every query after each case and checks each effect on its own, and a violation
    /// names the effect. A name already used by another query or by
    /// [`expect_effect`](Self::expect_effect) is [`Error::InvalidInput`].
    pub fn effects_query<F, Fut>(mut self, name: &str, count: F) -> Result<Self, Error>
    where
        F: Fn(Vec<String>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<BTreeMap<String, usize>, BoxError>> + Send + 'static,
    {
        self.name_is_free(name, "effects_query")?;
        if self.expected.iter().any(|e| e == name) {
            return Err(Error::invalid(
                "effects_query",
                format!(
                    "{name:?} is already an expect_effect's name: give the queried effect another"
                ),
            ));
        }
        let query: Query = Arc::new(move |ids| Box::pin(count(ids)));
        self.queries.push((name.to_owned(), query));
        Ok(self)
    }

    /// Refuse `name` if an effects query has it.
    fn name_is_free(&self, name: &str, by: &'static str) -> Result<(), Error> {
        if self.queries.iter().any(|(n, _)| n == name) {
            return Err(Error::invalid(
                by,
                format!("{name:?} is already an effects_query's name: each effect needs its own"),
            ));
        }
        Ok(())
    }

    /// Give each message a payload drawn from `strategy` (by default a message's payload is
    /// empty). The handler reads it as [`Message::payload`](crate::Message::payload). Draw
    /// malformed payloads too, and say which are poison with [`poison`](Self::poison): the
    /// run then tests how the consumer handles them. A failure shrinks the payloads with
    /// the schedule and prints them. The testkit's README has an example.
    pub fn payloads<S>(mut self, strategy: S) -> Self
    where
        S: Strategy<Value = Vec<u8>> + Send + Sync + 'static,
    {
        self.payloads = Some(strategy.sboxed());
        self
    }

    /// Which payloads are poison: messages no retry can process, which the consumer must
    /// reject. For a poison message the kit expects its key to end rejected (a stored
    /// failure, [`FailurePolicy::Store`](dedup_core::FailurePolicy::Store), or a dead
    /// letter) and the delivery acknowledged; it expects none of its effects, and still
    /// checks that none repeats beyond what the mode allows. Every other message must end
    /// processed: a stored failure or a dead letter for it is a lost message. Without this,
    /// no payload is poison.
    pub fn poison<F>(mut self, is_poison: F) -> Self
    where
        F: Fn(&[u8]) -> bool + Send + Sync + 'static,
    {
        self.poison = Some(Arc::new(is_poison));
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
    ///
    /// # Panics
    ///
    /// When the consumer broke a guarantee, with the story of the smallest schedule. Also
    /// as [`run_with`](Self::run_with).
    pub fn check<C: Consumer>(self, consumer: C) -> Report {
        self.run(consumer).unwrap_or_else(|f| panic!("{f}"))
    }

    /// [`run_with`](Self::run_with), panicking with the failure's story.
    ///
    /// # Panics
    ///
    /// When the consumer broke a guarantee, with the story of the smallest schedule. Also
    /// as [`run_with`](Self::run_with).
    pub fn check_with<C, F, Fut>(self, setup: F) -> Report
    where
        C: Consumer,
        F: FnOnce(Setup) -> Fut,
        Fut: Future<Output = Result<Subject<C>, BoxError>>,
    {
        self.run_with(setup).unwrap_or_else(|f| panic!("{f}"))
    }

    /// Runs `consumer` on a [`MemoryStore`](dedup_core::MemoryStore) on the kit's clock.
    ///
    /// # Errors
    ///
    /// A [`Failure`] when the consumer broke a guarantee. It holds the smallest schedule,
    /// its story and the seed that replays it.
    ///
    /// # Panics
    ///
    /// As [`run_with`](Self::run_with).
    pub fn run<C: Consumer>(self, consumer: C) -> Result<Report, Box<Failure>> {
        self.run_with(|setup| async move {
            Ok(Subject {
                store: Arc::new(setup.memory_store()) as Arc<dyn DedupStore>,
                consumer,
            })
        })
    }

    /// Runs the consumer and store that `setup` builds.
    ///
    /// `setup` runs on the kit's runtime, a current-thread tokio runtime: build connection
    /// pools there. It gets the kit's [`Setup`]: its clock, so expiring leases is the
    /// kit's to decide, and its own tables, fresh per run and dropped after it. Build the
    /// store with [`Setup::sqlite`], [`Setup::postgres`], [`Setup::mysql`] or
    /// [`Setup::memory_store`].
    ///
    /// Every case runs against this one store; message ids are unique per case. So your
    /// service's database works: the kit's tables sit beside the service's, which it
    /// never writes.
    ///
    /// # Errors
    ///
    /// A [`Failure`] when the consumer broke a guarantee, as [`run`](Self::run).
    ///
    /// # Panics
    ///
    /// The test cannot run, so it panics:
    /// - when `setup` fails (what it created is dropped first);
    /// - when called inside a tokio runtime (the kit runs its own);
    /// - when [`SEED_ENV`] holds something other than a seed;
    /// - when an [`effects_query`](Self::effects_query) fails.
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
            checks: Checks {
                failures: self.failures,
                draws_payloads: self.payloads.is_some(),
                poison: self.poison.clone(),
                consumer_name: self.consumer_name.clone(),
                expected: self.expected.clone(),
                queries: self.queries.clone(),
            },
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
        let schedules = Schedule::strategy(
            self.max_messages,
            self.max_workers,
            self.max_steps,
            self.failures,
        );
        // One payload per message the schedule may have, drawn after the schedule (so
        // proptest shrinks the schedule first). Without a generator every payload is empty.
        let payloads = match &self.payloads {
            Some(p) => proptest::collection::vec(p.clone(), self.max_messages).sboxed(),
            None => Just(Vec::new()).sboxed(),
        };
        let tally = std::sync::Mutex::new(Tally::default());
        let result = runner.run(&(schedules, payloads), |(schedule, payloads)| {
            let ran = bench.case(&schedule, &payloads);
            tally.lock().unwrap_or_else(|p| p.into_inner()).add(&ran);
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
        let tally = tally.into_inner().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(()) => Ok(Report {
                cases: self.cases,
                runs: cases_run,
                seed: hex(&seed),
                elapsed: started.elapsed(),
                kills: tally.kills,
                failures: tally.failures,
                excused_repeats: tally.excused,
                poison_messages: tally.poison,
            }),
            Err(TestError::Fail(reason, (schedule, payloads))) => {
                // proptest shrinks a tuple's parts once each, in order; finish the job
                // greedily (runs take milliseconds), then run the result once more for
                // its story.
                let (schedule, payloads) = bench.minimize(schedule, payloads);
                let again = bench.case(&schedule, &payloads);
                Err(Box::new(Failure {
                    payloads,
                    poison: again.poison,
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
