//! Deliberately broken stores: [`FaultyStore`] is the contract (the pure functions of
//! `dedup_core::backend::transition` over a map, like `MemoryStore`) with one [`Fault`] switched on.
//! With [`Fault::None`] it is a correct store, which the tests also run the whole suite
//! against, so every clause that fails on a faulty store fails because of its fault.
//!
//! [`FakeTxFactory`] adds an in-memory imitation of the SQL backends' transactional
//! extension (a per-key lock stands for the unique index; writes are applied when the
//! "transaction" commits), correct or ignoring the transaction.

#![allow(dead_code)] // each test binary uses its own part

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use dedup_conformance::{
    Namespaces, StoreFactory, TestContext, TransactionalFactory, TxEnd, TxInboxFactory, TxJob,
    TxWork,
};
use dedup_core::backend::transition::{self, Purgeable, Write};
use dedup_core::backend::{PurgeBatch, PurgeBatches, PurgeStep, check};
use dedup_core::layers::RetryPolicy;
use dedup_core::{BoxError, FailurePolicy, Handled, InboxError, TxAttempt, TxAttempts, TxEngine};
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, Clock, CommitRequest, DedupStore, Error,
    Fingerprint, ItemResult, Key, Lease, LeaseToken, PurgeOptions, PurgeReport, Record,
    RecordState, Result, Timestamp, TxClaim,
};
use futures::future::BoxFuture;

/// One way to break the contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// No fault: a correct store.
    None,
    /// Claim reads the record, yields, then writes what it decided from the stale read.
    CheckThenActClaim,
    /// Commit reads the record, yields, then completes it even if it changed hands.
    CheckThenActCommit,
    /// Commit completes any in-flight record, whoever holds it.
    CommitWithoutTokenCheck,
    /// Release deletes the record (so the next claim restarts at fence 1).
    ReleaseDeletesRecord,
    /// Purge removes every in-flight record, live or not.
    PurgeRemovesLiveLeases,
    /// Purge removes everything in one batch, ignoring the batch size.
    PurgeIgnoresBatchSize,
    /// Claims never check the fingerprint.
    FingerprintIgnored,
    /// A key repeated in one batch is processed once; its repeats get the first answer.
    BatchSkipsDuplicates,
    /// A batch validates each item only when it reaches it (earlier items are written).
    BatchValidatesLazily,
    /// A takeover keeps the old fence.
    TakeoverKeepsFence,
    /// A lease is still live at its expiry instant (`now <= expires_at`).
    LiveAtExpiry,
    /// An empty outcome is stored as no outcome.
    EmptyOutcomeStoredAsNone,
    /// A repeated commit of the same lease overwrites the outcome.
    RetryCommitOverwrites,
    /// Records are keyed by message id only (consumers share them).
    ConsumerIgnored,
    /// Renew extends from the old expiry instead of from now.
    RenewFromOldExpiry,
    /// The constructor accepts any key prefix.
    NamesUnchecked,
    /// `release_failed` releases the lease and drops the failure.
    ReleaseFailedDropsCause,
}

struct Inner {
    clock: Arc<dyn Clock>,
    records: Mutex<BTreeMap<Key, Record>>,
    /// The fake transactional extension's business table.
    rows: Mutex<HashMap<Key, Vec<String>>>,
    /// The fake transactional extension's "unique index": one lock per key.
    tx_locks: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<()>>>>,
}

/// A store with one [`Fault`].
#[derive(Clone)]
pub struct FaultyStore {
    fault: Fault,
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The window a check-then-act fault leaves between its read and its write (a real
/// store's would be a network round trip).
async fn window() {
    tokio::time::sleep(Duration::from_millis(2)).await;
}

impl FaultyStore {
    /// A store with `fault` on `clock`.
    pub fn new(fault: Fault, clock: Arc<dyn Clock>) -> Self {
        FaultyStore {
            fault,
            inner: Arc::new(Inner {
                clock,
                records: Mutex::new(BTreeMap::new()),
                rows: Mutex::new(HashMap::new()),
                tx_locks: Mutex::new(HashMap::new()),
            }),
        }
    }

    fn is(&self, fault: Fault) -> bool {
        self.fault == fault
    }

    fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    fn records(&self) -> MutexGuard<'_, BTreeMap<Key, Record>> {
        lock(&self.inner.records)
    }

    /// Where `key`'s record is stored.
    fn slot(&self, key: &Key) -> Key {
        if self.is(Fault::ConsumerIgnored) {
            Key::new("any", key.message_id()).expect("valid key")
        } else {
            key.clone()
        }
    }

    fn read(&self, key: &Key) -> Option<Record> {
        self.records().get(&self.slot(key)).cloned()
    }

    fn apply(&self, map: &mut BTreeMap<Key, Record>, key: &Key, write: Write) {
        if let Write::Put(record) = write {
            map.insert(self.slot(key), record);
        }
    }

    /// The contract's claim, bent by the claim faults.
    fn decide_claim(
        &self,
        record: Option<&Record>,
        key: &Key,
        options: &ClaimOptions,
        now: Timestamp,
    ) -> Result<(Claim, Write)> {
        if self.is(Fault::LiveAtExpiry)
            && let Some(Record {
                attempt,
                state: RecordState::InFlight { expires_at, .. },
                ..
            }) = record
            && now == *expires_at
        {
            let claim = Claim::InFlight {
                expires_at: *expires_at,
                attempt: *attempt,
            };
            return Ok((claim, Write::Unchanged));
        }
        let unchecked;
        let record = if self.is(Fault::FingerprintIgnored) {
            unchecked = record.map(|r| Record {
                fingerprint: None,
                ..r.clone()
            });
            unchecked.as_ref()
        } else {
            record
        };
        let (claim, write) = transition::claim(record, key, options, now, LeaseToken::random())?;
        match (claim, write) {
            (Claim::Acquired(mut lease), Write::Put(mut rec))
                if self.is(Fault::TakeoverKeepsFence) && lease.fence > 1 =>
            {
                lease.fence -= 1;
                rec.fence -= 1;
                Ok((Claim::Acquired(lease), Write::Put(rec)))
            }
            other => Ok(other),
        }
    }

    fn claim_locked(&self, key: &Key, options: &ClaimOptions, now: Timestamp) -> Result<Claim> {
        let mut map = self.records();
        let (claim, write) = self.decide_claim(map.get(&self.slot(key)), key, options, now)?;
        self.apply(&mut map, key, write);
        Ok(claim)
    }

    /// The contract's commit, bent by the commit faults.
    fn decide_commit(
        &self,
        record: Option<&Record>,
        lease: &Lease,
        outcome: Option<&[u8]>,
        now: Timestamp,
    ) -> Result<Write> {
        let outcome = match outcome {
            Some([]) if self.is(Fault::EmptyOutcomeStoredAsNone) => None,
            other => other,
        };
        let mut lease = lease.clone();
        match record.map(|r| &r.state) {
            Some(RecordState::InFlight { token, .. })
                if self.is(Fault::CommitWithoutTokenCheck) =>
            {
                lease.token = *token;
            }
            Some(RecordState::Completed { token, .. })
                if self.is(Fault::RetryCommitOverwrites) && *token == Some(lease.token) =>
            {
                let mut rec = record.cloned().expect("a completed record");
                if let RecordState::Completed { outcome: o, .. } = &mut rec.state {
                    *o = outcome.map(<[u8]>::to_vec);
                }
                return Ok(Write::Put(rec));
            }
            _ => {}
        }
        transition::commit(record, &lease, outcome, now)
    }

    fn commit_locked(&self, lease: &Lease, outcome: Option<&[u8]>, now: Timestamp) -> Result<()> {
        let mut map = self.records();
        let write = self.decide_commit(map.get(&self.slot(&lease.key)), lease, outcome, now)?;
        self.apply(&mut map, &lease.key, write);
        Ok(())
    }

    /// Per-item results of a batch, in order, with the batch faults.
    fn batch<R: Clone, T>(
        &self,
        items: &[R],
        key_of: impl Fn(&R) -> &Key,
        validate: impl Fn(&R) -> Result<()>,
        mut run: impl FnMut(&R) -> ItemResult<T>,
    ) -> Result<Vec<ItemResult<T>>>
    where
        T: Clone,
    {
        let mut out: Vec<ItemResult<T>> = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            if self.is(Fault::BatchValidatesLazily) {
                validate(item)?;
            }
            let first = items[..i].iter().position(|r| key_of(r) == key_of(item));
            let result = match first {
                Some(j) if self.is(Fault::BatchSkipsDuplicates) => clone_result(&out[j]),
                _ => run(item),
            };
            out.push(result);
        }
        Ok(out)
    }

    fn tx_lock(&self, key: &Key) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.inner.tx_locks)
            .entry(key.clone())
            .or_default()
            .clone()
    }

    fn put(&self, key: &Key, write: Write, row: Option<&str>) {
        self.apply(&mut self.records(), key, write);
        if let Some(label) = row {
            lock(&self.inner.rows)
                .entry(key.clone())
                .or_default()
                .push(label.to_owned());
        }
    }
}

fn clone_result<T: Clone>(r: &ItemResult<T>) -> ItemResult<T> {
    match r {
        Ok(v) => Ok(v.clone()),
        Err(Error::LeaseLost { key }) => Err(Error::LeaseLost { key: key.clone() }),
        Err(Error::FingerprintMismatch { key }) => {
            Err(Error::FingerprintMismatch { key: key.clone() })
        }
        Err(other) => Err(Error::invalid("batch", other.to_string())),
    }
}

#[async_trait]
impl DedupStore for FaultyStore {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        options.validate()?;
        let now = self.now();
        if self.is(Fault::CheckThenActClaim) {
            let seen = self.read(key);
            window().await;
            let (claim, write) = self.decide_claim(seen.as_ref(), key, options, now)?;
            self.apply(&mut self.records(), key, write);
            return Ok(claim);
        }
        self.claim_locked(key, options, now)
    }

    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        if !self.is(Fault::BatchValidatesLazily) {
            check::claim_many(requests)?;
        }
        let now = self.now();
        self.batch(
            requests,
            |r| &r.key,
            |r| r.options.validate(),
            |r| self.claim_locked(&r.key, &r.options, now),
        )
    }

    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        check::renew(extend_by)?;
        let now = self.now();
        let mut map = self.records();
        let base = if self.is(Fault::RenewFromOldExpiry) {
            lease.expires_at
        } else {
            now
        };
        let (renewed, write) =
            transition::renew(map.get(&self.slot(&lease.key)), lease, extend_by, base)?;
        self.apply(&mut map, &lease.key, write);
        Ok(renewed)
    }

    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        check::commit(outcome)?;
        let now = self.now();
        if self.is(Fault::CheckThenActCommit) {
            let seen = self.read(&lease.key);
            window().await;
            let write = self.decide_commit(seen.as_ref(), lease, outcome, now)?;
            self.apply(&mut self.records(), &lease.key, write);
            return Ok(());
        }
        self.commit_locked(lease, outcome, now)
    }

    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        if !self.is(Fault::BatchValidatesLazily) {
            check::commit_many(requests)?;
        }
        let now = self.now();
        self.batch(
            requests,
            |r| &r.lease.key,
            |r| check::commit(r.outcome.as_deref()),
            |r| self.commit_locked(&r.lease, r.outcome.as_deref(), now),
        )
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let now = self.now();
        let slot = self.slot(&lease.key);
        let mut map = self.records();
        let write = transition::release(map.get(&slot), lease, now)?;
        if self.is(Fault::ReleaseDeletesRecord) {
            map.remove(&slot);
        } else {
            self.apply(&mut map, &lease.key, write);
        }
        Ok(())
    }

    async fn release_failed(&self, lease: &Lease, failure: &dedup_core::Failure) -> Result<()> {
        dedup_core::backend::check::release_failed(failure)?;
        let now = self.now();
        let slot = self.slot(&lease.key);
        let mut map = self.records();
        let write = if self.is(Fault::ReleaseFailedDropsCause) {
            transition::release(map.get(&slot), lease, now)?
        } else {
            transition::release_failed(map.get(&slot), lease, failure, now)?
        };
        self.apply(&mut map, &lease.key, write);
        Ok(())
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        Ok(self.read(key))
    }

    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        dedup_core::backend::purge::run(self, options).await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_batch: true,
            // Records are written by `transition`, which keeps the first claim's time.
            first_claim_time: true,
            failure_causes: true,
            ..Capabilities::default()
        }
    }
}

/// Opens [`FaultyStore`]s with one fault, one per namespace.
pub struct FaultyFactory {
    fault: Fault,
    stores: Namespaces<FaultyStore>,
}

impl FaultyFactory {
    /// A factory of stores with `fault`.
    pub fn new(fault: Fault) -> Self {
        FaultyFactory {
            fault,
            stores: Namespaces::default(),
        }
    }
}

#[async_trait]
impl StoreFactory for FaultyFactory {
    type Store = FaultyStore;

    async fn open(&self, ctx: &TestContext) -> FaultyStore {
        self.stores
            .open(ctx, || FaultyStore::new(self.fault, ctx.clock.clone()))
    }

    /// The name is a key prefix, checked like the Redis store checks its own.
    async fn open_named(&self, ctx: &TestContext, name: &str) -> Option<Result<FaultyStore>> {
        let checked = match self.fault {
            Fault::NamesUnchecked => Ok(()),
            _ => dedup_core::backend::names::key_prefix(name),
        };
        Some(checked.map(|()| FaultyStore::new(self.fault, ctx.clock.clone())))
    }
}

/// The transactional extension imitated in memory over a correct [`FaultyStore`]; with
/// `ignores_transaction`, every write is made at once and kept on rollback, and
/// concurrent transactions do not wait for each other.
pub struct FakeTxFactory {
    base: FaultyFactory,
    ignores_transaction: bool,
    tx_inbox_break: TxInboxBreak,
}

/// One way to break the transactional inbox (its fake, over [`TxEngine`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxInboxBreak {
    /// No break: a correct transactional inbox.
    None,
    /// A completed key runs the handler again.
    RunsDuplicates,
    /// A failed run's business row is kept (the rollback is ignored).
    KeepsRolledBackRows,
    /// A failed run forgets its attempt (the count lives inside the rolled-back
    /// transaction, as with a bare `claim_in_tx`).
    ForgetsAttempts,
    /// A conflict the database asked to retry is never retried.
    NoRetry,
    /// A conflict is run again as a new attempt (released and claimed again), as a
    /// retryable error that is not a conflict is.
    CountsConflicts,
    /// A failure is never stored, whatever the policy.
    NoStoredFailure,
    /// The attempt limit is ignored.
    IgnoresMaxAttempts,
}

impl FakeTxFactory {
    /// A correct imitation.
    pub fn correct() -> Self {
        FakeTxFactory {
            base: FaultyFactory::new(Fault::None),
            ignores_transaction: false,
            tx_inbox_break: TxInboxBreak::None,
        }
    }

    /// A correct transactional extension with a transactional inbox broken as `how`.
    pub fn breaking_the_tx_inbox(how: TxInboxBreak) -> Self {
        FakeTxFactory {
            tx_inbox_break: how,
            ..Self::correct()
        }
    }

    /// An imitation that ignores the transaction.
    pub fn ignoring_the_transaction() -> Self {
        FakeTxFactory {
            ignores_transaction: true,
            ..Self::correct()
        }
    }

    /// Run one "transaction" on `key`: `decide` (under the key's lock, unless the
    /// transaction is ignored) gives the result, the record write and whether to insert
    /// the business row `label`; they are applied at once when ignoring the transaction,
    /// else after `hold` if `end` commits.
    async fn transaction<T>(
        &self,
        store: &FaultyStore,
        key: &Key,
        label: &str,
        hold: BoxFuture<'static, ()>,
        end: TxEnd,
        decide: impl FnOnce(Option<&Record>, Timestamp) -> Result<(T, Write, bool)>,
    ) -> Result<T> {
        let key_lock = store.tx_lock(key);
        let _held = match self.ignores_transaction {
            true => None,
            false => Some(key_lock.lock().await),
        };
        let (result, write, row) = decide(store.read(key).as_ref(), store.now())?;
        let row = row.then_some(label);
        if self.ignores_transaction {
            store.put(key, write, row);
            hold.await;
        } else {
            hold.await;
            if end == TxEnd::Commit {
                store.put(key, write, row);
            }
        }
        Ok(result)
    }
}

#[async_trait]
impl StoreFactory for FakeTxFactory {
    type Store = FaultyStore;

    async fn open(&self, ctx: &TestContext) -> FaultyStore {
        self.base.open(ctx).await
    }
}

#[async_trait]
impl TransactionalFactory for FakeTxFactory {
    async fn claim_in_transaction(
        &self,
        store: &FaultyStore,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
        label: &str,
        hold: BoxFuture<'static, ()>,
        end: TxEnd,
    ) -> Result<TxClaim> {
        self.transaction(store, key, label, hold, end, |record, now| {
            let (answer, write) = transition::tx_claim(record, key, fingerprint, now)?;
            let wrote = matches!(write, Write::Put(_));
            Ok((answer, write, wrote))
        })
        .await
    }

    async fn commit_in_transaction(
        &self,
        store: &FaultyStore,
        lease: &Lease,
        outcome: Option<&[u8]>,
        label: &str,
        end: TxEnd,
    ) -> Result<()> {
        let no_hold = Box::pin(async {});
        self.transaction(store, &lease.key, label, no_hold, end, |record, now| {
            let write = transition::commit(record, lease, outcome, now)?;
            Ok(((), write, true))
        })
        .await
    }

    async fn business_rows(&self, store: &FaultyStore, key: &Key) -> Vec<String> {
        lock(&store.inner.rows)
            .get(key)
            .cloned()
            .unwrap_or_default()
    }
}

/// What a fake handler does (see [`TxWork`]).
#[derive(Clone)]
enum Kind {
    Succeed(Option<Vec<u8>>),
    Fail(String),
    Hang,
    ConflictOnce(Option<Vec<u8>>),
}

/// The fake transactional inbox's runs: a "transaction" holds the key's lock, and its
/// writes (the business row, the completion) are applied only when it "commits".
struct FakeAttempts {
    store: FaultyStore,
    kind: Kind,
    hang: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::sync::oneshot::Receiver<()>,
    )>,
    runs: Arc<AtomicU32>,
    how: TxInboxBreak,
}

impl TxAttempts for FakeAttempts {
    fn attempt<'a>(&'a mut self, lease: &'a Lease) -> BoxFuture<'a, TxAttempt> {
        Box::pin(async move {
            let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
            let key_lock = self.store.tx_lock(&lease.key);
            let _held = key_lock.lock().await;
            let row = format!("row@{}", lease.attempt);
            let ran: std::result::Result<Option<Vec<u8>>, BoxError> = match self.kind.clone() {
                Kind::Succeed(outcome) => Ok(outcome),
                Kind::Fail(message) => Err(message.into()),
                Kind::Hang => {
                    let (started, proceed) = self.hang.take().expect("one hanging run");
                    let _ = started.send(());
                    match proceed.await {
                        Ok(()) => Ok(None),
                        Err(_) => Err("abandoned".into()),
                    }
                }
                Kind::ConflictOnce(outcome) if run > 1 => Ok(outcome),
                Kind::ConflictOnce(_) => {
                    let source: BoxError = Error::backend(
                        "fake",
                        true,
                        "could not serialize access due to concurrent update",
                    )
                    .into();
                    if self.how == TxInboxBreak::CountsConflicts {
                        return TxAttempt::HandlerFailed {
                            source,
                            retryable: true,
                        };
                    }
                    return TxAttempt::Conflict(source);
                }
            };
            match ran {
                Ok(outcome) => {
                    if let Err(source) = TxEngine::check_outcome(outcome.as_deref()) {
                        return TxAttempt::Outcome(source);
                    }
                    let record = self.store.read(&lease.key);
                    let now = self.store.now();
                    match transition::commit(record.as_ref(), lease, outcome.as_deref(), now) {
                        Ok(write) => {
                            self.store.put(&lease.key, write, Some(&row));
                            TxAttempt::Committed(outcome)
                        }
                        Err(e) => TxAttempt::Store(e),
                    }
                }
                Err(source) => {
                    if self.how == TxInboxBreak::KeepsRolledBackRows {
                        self.store.put(&lease.key, Write::Unchanged, Some(&row));
                    }
                    if self.how == TxInboxBreak::ForgetsAttempts {
                        let slot = self.store.slot(&lease.key);
                        self.store.records().remove(&slot);
                    }
                    let retryable = TxEngine::asks_for_retry(&*source, |_| None);
                    TxAttempt::HandlerFailed { source, retryable }
                }
            }
        })
    }
}

#[async_trait]
impl TxInboxFactory for FakeTxFactory {
    async fn tx_handle(
        &self,
        store: &FaultyStore,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        job: TxJob,
    ) -> std::result::Result<Handled, InboxError> {
        let TxJob {
            mut config,
            mut retry,
            work,
            runs,
        } = job;
        let how = self.tx_inbox_break;
        match how {
            TxInboxBreak::NoRetry => retry = RetryPolicy::NEVER,
            TxInboxBreak::NoStoredFailure => config.failures = FailurePolicy::Retry,
            TxInboxBreak::IgnoresMaxAttempts => config.max_attempts = None,
            TxInboxBreak::RunsDuplicates => {
                let slot = store.slot(key);
                let mut records = store.records();
                if records
                    .get(&slot)
                    .is_some_and(|r| matches!(r.state, RecordState::Completed { .. }))
                {
                    records.remove(&slot);
                }
            }
            _ => {}
        }
        let (kind, hang) = match work {
            TxWork::Succeed(o) => (Kind::Succeed(o), None),
            TxWork::Fail(m) => (Kind::Fail(m), None),
            TxWork::Hang { started, proceed } => (Kind::Hang, Some((started, proceed))),
            TxWork::ConflictOnce(o) => (Kind::ConflictOnce(o), None),
            other => panic!("unknown work {other:?}"),
        };
        let shared: Arc<dyn DedupStore> = Arc::new(store.clone());
        let engine = TxEngine::new(shared, config).with_retry(retry);
        let mut attempts = FakeAttempts {
            store: store.clone(),
            kind,
            hang,
            runs,
            how,
        };
        engine.run(key, fingerprint, &mut attempts).await
    }
}

/// The faulty store's purge batches, driven by the shared purge driver like every store's.
#[async_trait]
impl PurgeBatches for FaultyStore {
    type PurgeCursor = ();

    async fn purge_batch(&self, step: &PurgeStep, _: &mut ()) -> Result<PurgeBatch> {
        let limit = if self.is(Fault::PurgeIgnoresBatchSize) {
            usize::MAX
        } else {
            step.limit
        };
        let now = self.now();
        let mut map = self.records();
        let doomed: Vec<(Key, Purgeable)> = map
            .iter()
            .filter_map(|(slot, r)| {
                let why = match &r.state {
                    RecordState::InFlight { .. } if self.is(Fault::PurgeRemovesLiveLeases) => {
                        Some(Purgeable::Expired)
                    }
                    _ => transition::purgeable(r, now, step.retention),
                };
                why.map(|p| (slot.clone(), p))
            })
            .take(limit)
            .collect();
        let mut batch = PurgeBatch {
            exhausted: doomed.len() < limit,
            ..PurgeBatch::default()
        };
        for (slot, why) in &doomed {
            map.remove(slot);
            match why {
                Purgeable::Completed => batch.completed += 1,
                Purgeable::Expired => batch.expired += 1,
            }
        }
        Ok(batch)
    }
}
