//! The model-based test: random histories run against the store under test and
//! [`MemoryStore`], the reference model; every answer and every final record must match.
//!
//! A history is up to [`MAX_OPS`] operations from [`WORKERS`] workers over 6 keys (3
//! message ids × 2 consumers): claims (lease lengths chosen to land exactly on expiry
//! boundaries, optional fingerprints), commits (no outcome, empty or short binary
//! outcomes), releases, renewals, purges (retention 0 ms to 5 s, batches of 1 to 3),
//! `get`s, `claim_many` / `commit_many` batches (keys may repeat) and clock advances.
//! Each worker remembers the last lease it acquired per key, separately for each store,
//! and commits, renews or releases with it; a worker that never acquired a key uses a lease
//! the store never handed out. Tokens are random, so answers are compared with tokens left
//! out and records with each token replaced by the index of the claim that created it.
//!
//! The clock of one history advances by at most 5 s per operation, so well under a day in
//! all: stores that also expire records natively after their retention are unaffected.
//! Purges never set `max_batches`: which records a limited purge removes first is left to
//! the store, so only complete purges have one right answer.
//!
//! Each case opens a fresh store ([`TestContext::new`]). The number of cases is proptest's:
//! `PROPTEST_CASES` when set, else 256. A failure is shrunk to a minimal history, printed
//! with the operation that diverged.

use std::collections::HashMap;
use std::time::Duration;

use dedup_core::{
    ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Key, Lease, LeaseToken, MemoryStore,
    PurgeOptions, Record, RecordState, Timestamp,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, TestCaseError, TestCaseResult, TestRunner};

use crate::support::{Seen, fingerprint, forged_lease, key_for};
use crate::{StoreFactory, TestContext};

/// How many workers a history has.
pub const WORKERS: usize = 3;
/// The longest history generated.
pub const MAX_OPS: usize = 60;

const CONSUMERS: [&str; 2] = ["billing", "shipping"];
const MESSAGE_IDS: [&str; 3] = ["m0", "m1", "m2"];
const KEYS: usize = CONSUMERS.len() * MESSAGE_IDS.len();

/// One step of a history. Keys and workers are small indices.
#[derive(Clone, Debug)]
pub enum Op {
    /// `claim(key)` with a lease of `lease_ms` and fingerprint `fp{n}` if any.
    Claim {
        /// Who claims (its lease is remembered).
        worker: usize,
        /// Which key.
        key: usize,
        /// Lease length in ms.
        lease_ms: u64,
        /// Fingerprint number, if any.
        fp: Option<u8>,
    },
    /// `commit` of the worker's lease for `key`.
    Commit {
        /// Who commits.
        worker: usize,
        /// Which key.
        key: usize,
        /// The outcome.
        outcome: Option<Vec<u8>>,
    },
    /// `release` of the worker's lease for `key`.
    Release {
        /// Who releases.
        worker: usize,
        /// Which key.
        key: usize,
    },
    /// `renew` of the worker's lease for `key` by `ms`.
    Renew {
        /// Who renews.
        worker: usize,
        /// Which key.
        key: usize,
        /// Extension in ms.
        ms: u64,
    },
    /// `purge` with a retention of `retention_ms` in batches of `batch_size`.
    Purge {
        /// Retention in ms.
        retention_ms: u64,
        /// Batch size.
        batch_size: usize,
    },
    /// Move the clock forward.
    Advance {
        /// By how many ms.
        ms: u64,
    },
    /// `get(key)`.
    Get {
        /// Which key.
        key: usize,
    },
    /// `claim_many` of `(key, lease_ms, fp)` items.
    ClaimMany {
        /// Who claims.
        worker: usize,
        /// The items.
        items: Vec<(usize, u64, Option<u8>)>,
    },
    /// `commit_many` of the worker's leases for `(key, outcome)` items.
    CommitMany {
        /// Who commits.
        worker: usize,
        /// The items.
        items: Vec<(usize, Option<Vec<u8>>)>,
    },
}

fn op(purges: bool) -> impl Strategy<Value = Op> {
    let worker = 0..WORKERS;
    let key = 0..KEYS;
    let lease = select(vec![1u64, 999, 1000, 2500, 5000]);
    let fp = proptest::option::weighted(0.3, 0u8..2);
    let outcome = proptest::option::of(vec(any::<u8>(), 0..3));
    prop_oneof![
        4 => (worker.clone(), key.clone(), lease.clone(), fp.clone())
            .prop_map(|(worker, key, lease_ms, fp)| Op::Claim { worker, key, lease_ms, fp }),
        3 => (worker.clone(), key.clone(), outcome.clone())
            .prop_map(|(worker, key, outcome)| Op::Commit { worker, key, outcome }),
        1 => (worker.clone(), key.clone()).prop_map(|(worker, key)| Op::Release { worker, key }),
        1 => (worker.clone(), key.clone(), lease.clone())
            .prop_map(|(worker, key, ms)| Op::Renew { worker, key, ms }),
        1 => (select(vec![0u64, 1, 1000, 5000]), 1usize..4, 0..KEYS)
            .prop_map(move |(retention_ms, batch_size, key)| match purges {
                true => Op::Purge { retention_ms, batch_size },
                false => Op::Get { key },
            }),
        2 => select(vec![1u64, 500, 999, 1000, 1001, 2500, 5000])
            .prop_map(|ms| Op::Advance { ms }),
        1 => key.clone().prop_map(|key| Op::Get { key }),
        1 => (worker.clone(), vec((key.clone(), lease, fp), 0..4))
            .prop_map(|(worker, items)| Op::ClaimMany { worker, items }),
        1 => (worker, vec((key, outcome), 0..4))
            .prop_map(|(worker, items)| Op::CommitMany { worker, items }),
    ]
}

/// The proptest strategy of histories.
pub fn histories() -> impl Strategy<Value = Vec<Op>> {
    vec(op(true), 1..MAX_OPS)
}

/// [`histories`] without purges (a `get` in each purge's place), for stores whose purge
/// removes records at a coarser grain than the retention asks (whole time partitions):
/// [`MemoryStore`] removes each record the moment it is past retention.
pub fn histories_without_purges() -> impl Strategy<Value = Vec<Op>> {
    vec(op(false), 1..MAX_OPS)
}

/// The configuration [`model_based_histories_match_memory_store`] runs with: proptest's
/// defaults (so `PROPTEST_CASES` and the other `PROPTEST_*` variables apply; 256 cases
/// when unset), without failure-persistence files.
pub fn model_config() -> Config {
    Config {
        failure_persistence: None,
        ..Config::default()
    }
}

/// Random histories of claims, commits, releases, renewals, purges, batches, `get`s and
/// clock advances from several workers give the same answers and leave the same records
/// on the store under test as on [`MemoryStore`]. Needs the multi-threaded tokio runtime
/// (the `suite!` tests use it). Runs [`StoreFactory::model_cases`] histories when the
/// factory asks a number.
pub async fn model_based_histories_match_memory_store<F: StoreFactory>(factory: &F) {
    let mut config = model_config();
    if let Some(cases) = factory.model_cases() {
        config.cases = cases;
    }
    check_histories(factory, config).await;
}

/// [`model_based_histories_match_memory_store`] with an explicit proptest `config`.
pub async fn check_histories<F: StoreFactory>(factory: &F, config: Config) {
    run_histories(factory, config, histories()).await;
}

/// [`check_histories`] over [`histories_without_purges`].
pub async fn check_histories_without_purges<F: StoreFactory>(factory: &F, config: Config) {
    run_histories(factory, config, histories_without_purges()).await;
}

async fn run_histories<F: StoreFactory>(
    factory: &F,
    config: Config,
    histories: impl Strategy<Value = Vec<Op>>,
) {
    let handle = tokio::runtime::Handle::current();
    assert_eq!(
        handle.runtime_flavor(),
        tokio::runtime::RuntimeFlavor::MultiThread,
        "the model-based clause needs #[tokio::test(flavor = \"multi_thread\")]"
    );
    let result = tokio::task::block_in_place(|| {
        TestRunner::new(config).run(&histories, |ops| {
            handle.block_on(run_history(factory, &ops))
        })
    });
    if let Err(failure) = result {
        panic!("the store diverged from MemoryStore: {failure}");
    }
}

fn key_of(i: usize) -> Key {
    key_for(CONSUMERS[i % 2], MESSAGE_IDS[i / 2])
}

fn claim_options(lease_ms: u64, fp: Option<u8>) -> ClaimOptions {
    let options = ClaimOptions::lease(Duration::from_millis(lease_ms));
    match fp {
        Some(n) => options.with_fingerprint(fingerprint(&format!("fp{n}"))),
        None => options,
    }
}

/// A record with its tokens replaced by the index of the claim that created them.
#[derive(Debug, PartialEq, Eq)]
struct Normal {
    fence: u64,
    attempt: u32,
    fingerprint: Option<String>,
    state: NormalState,
}

#[derive(Debug, PartialEq, Eq)]
enum NormalState {
    InFlight {
        by: Option<usize>,
        expires_at: Timestamp,
    },
    Completed {
        by: Option<Option<usize>>,
        processed_at: Timestamp,
        outcome: Option<Vec<u8>>,
    },
}

/// One store's side of a history: the store, each worker's last lease per key, and the
/// claim index of every token it handed out.
struct Side<'a, S: ?Sized> {
    store: &'a S,
    leases: HashMap<(usize, usize), Lease>,
    tokens: HashMap<LeaseToken, usize>,
}

impl<'a, S: DedupStore + ?Sized> Side<'a, S> {
    fn new(store: &'a S) -> Self {
        Side {
            store,
            leases: HashMap::new(),
            tokens: HashMap::new(),
        }
    }

    fn lease(&self, worker: usize, key: usize, now: Timestamp) -> Lease {
        self.leases
            .get(&(worker, key))
            .cloned()
            .unwrap_or_else(|| forged_lease(&key_of(key), now))
    }

    fn remember(&mut self, worker: usize, key: usize, lease: Lease, claim_index: usize) {
        self.tokens.insert(lease.token, claim_index);
        self.leases.insert((worker, key), lease);
    }

    fn normal(&self, record: Record) -> Normal {
        let by = |t: &LeaseToken| self.tokens.get(t).copied();
        Normal {
            fence: record.fence,
            attempt: record.attempt,
            fingerprint: record.fingerprint.map(|f| f.as_str().to_owned()),
            state: match &record.state {
                RecordState::InFlight { token, expires_at } => NormalState::InFlight {
                    by: by(token),
                    expires_at: *expires_at,
                },
                RecordState::Completed {
                    token,
                    processed_at,
                    outcome,
                } => NormalState::Completed {
                    by: token.as_ref().map(by),
                    processed_at: *processed_at,
                    outcome: outcome.clone(),
                },
            },
        }
    }

    async fn get(&self, key: usize) -> Result<Option<Normal>, String> {
        match self.store.get(&key_of(key)).await {
            Ok(record) => Ok(record.map(|r| self.normal(r))),
            Err(e) => Err(format!("{e:?}")),
        }
    }

    /// Run `op` (the `index`th of its history); its answer as seen.
    async fn apply(&mut self, index: usize, op: &Op, now: Timestamp) -> Vec<Seen> {
        match op {
            Op::Claim {
                worker,
                key,
                lease_ms,
                fp,
            } => {
                let result = self
                    .store
                    .claim(&key_of(*key), &claim_options(*lease_ms, *fp))
                    .await;
                if let Ok(dedup_core::Claim::Acquired(lease)) = &result {
                    self.remember(*worker, *key, lease.clone(), index);
                }
                vec![Seen::claim(&result)]
            }
            Op::Commit {
                worker,
                key,
                outcome,
            } => {
                let lease = self.lease(*worker, *key, now);
                vec![Seen::unit(
                    &self.store.commit(&lease, outcome.as_deref()).await,
                )]
            }
            Op::Release { worker, key } => {
                let lease = self.lease(*worker, *key, now);
                vec![Seen::unit(&self.store.release(&lease).await)]
            }
            Op::Renew { worker, key, ms } => {
                let lease = self.lease(*worker, *key, now);
                let result = self.store.renew(&lease, Duration::from_millis(*ms)).await;
                if let Ok(renewed) = &result {
                    self.leases.insert((*worker, *key), renewed.clone());
                }
                vec![Seen::of(&result, Seen::lease)]
            }
            Op::Purge {
                retention_ms,
                batch_size,
            } => {
                // Unpaced, so batch counts are exact (a paced batch of a multi-round-trip
                // backend may stop early at its deadline).
                let options = PurgeOptions::older_than(Duration::from_millis(*retention_ms))
                    .batch_size(*batch_size)
                    .unpaced();
                vec![Seen::of(&self.store.purge(&options).await, |r| {
                    Seen::Purged {
                        completed: r.completed,
                        expired: r.expired,
                        batches: r.batches,
                    }
                })]
            }
            Op::Advance { .. } | Op::Get { .. } => Vec::new(),
            Op::ClaimMany { worker, items } => {
                let requests: Vec<ClaimRequest> = items
                    .iter()
                    .map(|(k, lease_ms, fp)| {
                        ClaimRequest::new(key_of(*k), claim_options(*lease_ms, *fp))
                    })
                    .collect();
                match self.store.claim_many(&requests).await {
                    Ok(results) => {
                        for ((k, ..), result) in items.iter().zip(&results) {
                            if let Ok(dedup_core::Claim::Acquired(lease)) = result {
                                self.remember(*worker, *k, lease.clone(), index);
                            }
                        }
                        results.iter().map(Seen::claim).collect()
                    }
                    Err(e) => vec![Seen::of::<()>(&Err(e), |_| Seen::Done)],
                }
            }
            Op::CommitMany { worker, items } => {
                let requests: Vec<CommitRequest> = items
                    .iter()
                    .map(|(k, outcome)| CommitRequest {
                        lease: self.lease(*worker, *k, now),
                        outcome: outcome.clone(),
                    })
                    .collect();
                match self.store.commit_many(&requests).await {
                    Ok(results) => results.iter().map(Seen::unit).collect(),
                    Err(e) => vec![Seen::of::<()>(&Err(e), |_| Seen::Done)],
                }
            }
        }
    }
}

async fn run_history<F: StoreFactory>(factory: &F, ops: &[Op]) -> TestCaseResult {
    let ctx = TestContext::new("model");
    let sut_store = factory.open(&ctx).await;
    let model_store = MemoryStore::with_clock(ctx.clock.clone());
    let mut sut = Side::new(&sut_store);
    let mut model = Side::new(&model_store);
    for (index, op) in ops.iter().enumerate() {
        if let Op::Advance { ms } = op {
            ctx.clock.advance(Duration::from_millis(*ms));
        }
        let now = ctx.now();
        let (got, want) = (
            sut.apply(index, op, now).await,
            model.apply(index, op, now).await,
        );
        if got != want {
            return Err(TestCaseError::fail(format!(
                "operation {index} ({op:?}): the store answered {got:?}, MemoryStore {want:?}"
            )));
        }
        if let Op::Get { key } = op {
            compare_records(&sut, &model, *key, &format!("operation {index} ({op:?})")).await?;
        }
    }
    for key in 0..KEYS {
        compare_records(&sut, &model, key, "at the end of the history").await?;
    }
    Ok(())
}

async fn compare_records<S: DedupStore + ?Sized>(
    sut: &Side<'_, S>,
    model: &Side<'_, MemoryStore>,
    key: usize,
    when: &str,
) -> TestCaseResult {
    let (got, want) = (sut.get(key).await, model.get(key).await);
    if got != want {
        return Err(TestCaseError::fail(format!(
            "{when}: record of {} is {got:?} in the store, {want:?} in MemoryStore",
            key_of(key)
        )));
    }
    Ok(())
}
