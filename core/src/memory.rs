//! [`MemoryStore`]: the reference implementation of the contract.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::transition::{self, Purgeable, Write};
use crate::backend::{PurgeBatch, PurgeBatches, PurgeStep, Storage};
use crate::store::ItemResult;
use crate::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, Clock, CommitRequest, Key, Lease, LeaseToken,
    PurgeReport, PurgeRun, Record, Result, SystemClock, Timestamp,
};

/// An in-process store: a map under a mutex, following [`transition`] exactly.
///
/// It is the model the conformance suite compares every backend against, and a fine store
/// for tests and single-process tools. It is not persistent and not shared between
/// processes: a restart forgets every record, so duplicates after a restart are processed
/// again.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    clock: Arc<dyn Clock>,
    records: Mutex<BTreeMap<Key, Record>>,
    last_purge: Mutex<Option<PurgeRun>>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An empty store on `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryStore {
            inner: Arc::new(Inner {
                clock,
                records: Mutex::new(BTreeMap::new()),
                last_purge: Mutex::new(None),
            }),
        }
    }

    /// How many records are stored (any state).
    pub fn len(&self) -> usize {
        self.records().len()
    }

    /// Whether no record is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every stored record, ordered by key (for tests and model comparison).
    pub fn snapshot(&self) -> Vec<Record> {
        self.records().values().cloned().collect()
    }

    fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    fn records(&self) -> MutexGuard<'_, BTreeMap<Key, Record>> {
        // A panic while holding the lock cannot leave a record half-written (every write is
        // one insert), so a poisoned lock is still consistent.
        self.inner
            .records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn apply(map: &mut BTreeMap<Key, Record>, key: &Key, write: Write) {
        if let Write::Put(record) = write {
            map.insert(key.clone(), record);
        }
    }

    fn claim_locked(
        map: &mut BTreeMap<Key, Record>,
        key: &Key,
        options: &ClaimOptions,
        now: Timestamp,
    ) -> Result<Claim> {
        let (claim, write) =
            transition::claim(map.get(key), key, options, now, LeaseToken::random())?;
        Self::apply(map, key, write);
        Ok(claim)
    }

    fn commit_locked(
        map: &mut BTreeMap<Key, Record>,
        lease: &Lease,
        outcome: Option<&[u8]>,
        now: Timestamp,
    ) -> Result<()> {
        let write = transition::commit(map.get(&lease.key), lease, outcome, now)?;
        Self::apply(map, &lease.key, write);
        Ok(())
    }
}

#[async_trait]
impl Storage for MemoryStore {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        let now = self.now();
        Self::claim_locked(&mut self.records(), key, options, now)
    }

    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        let now = self.now();
        let mut map = self.records();
        Ok(requests
            .iter()
            .map(|r| Self::claim_locked(&mut map, &r.key, &r.options, now))
            .collect())
    }

    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        let now = self.now();
        let mut map = self.records();
        let (renewed, write) = transition::renew(map.get(&lease.key), lease, extend_by, now)?;
        Self::apply(&mut map, &lease.key, write);
        Ok(renewed)
    }

    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        let now = self.now();
        Self::commit_locked(&mut self.records(), lease, outcome, now)
    }

    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        let now = self.now();
        let mut map = self.records();
        Ok(requests
            .iter()
            .map(|r| Self::commit_locked(&mut map, &r.lease, r.outcome.as_deref(), now))
            .collect())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let now = self.now();
        let mut map = self.records();
        let write = transition::release(map.get(&lease.key), lease, now)?;
        Self::apply(&mut map, &lease.key, write);
        Ok(())
    }

    async fn release_failed(&self, lease: &Lease, failure: &crate::Failure) -> Result<()> {
        let now = self.now();
        let mut map = self.records();
        let write = transition::release_failed(map.get(&lease.key), lease, failure, now)?;
        Self::apply(&mut map, &lease.key, write);
        Ok(())
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        Ok(self.records().get(key).cloned())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_batch: true,
            first_claim_time: true,
            failure_causes: true,
            ..Capabilities::default()
        }
    }

    async fn record_purge(&self, report: &PurgeReport) -> Result<()> {
        let run = PurgeRun::of(report, self.now());
        *self
            .inner
            .last_purge
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(run);
        Ok(())
    }
}

#[async_trait]
impl PurgeBatches for MemoryStore {
    type PurgeCursor = ();

    async fn purge_batch(&self, step: &PurgeStep, _: &mut ()) -> Result<PurgeBatch> {
        let now = self.now();
        let mut map = self.records();
        let doomed: Vec<(Key, Purgeable)> = map
            .values()
            .filter_map(|r| {
                transition::purgeable(r, now, step.retention).map(|p| (r.key.clone(), p))
            })
            .take(step.limit)
            .collect();
        let mut batch = PurgeBatch {
            exhausted: doomed.len() < step.limit,
            ..PurgeBatch::default()
        };
        for (key, why) in doomed {
            map.remove(&key);
            match why {
                Purgeable::Completed => batch.completed += 1,
                Purgeable::Expired => batch.expired += 1,
            }
        }
        Ok(batch)
    }
}

#[async_trait]
impl crate::backend::AdminStorage for MemoryStore {
    async fn now(&self) -> Result<Timestamp> {
        Ok(self.now())
    }

    async fn list(&self, filter: &crate::admin::ListFilter) -> Result<Vec<Record>> {
        let now = self.now();
        Ok(self
            .records()
            .values()
            .filter(|r| filter.accepts(r, now))
            .take(filter.limit)
            .cloned()
            .collect())
    }

    async fn stats(&self, top: usize) -> Result<crate::admin::Stats> {
        let mut stats = crate::admin::Stats::at(self.now());
        for record in self.records().values() {
            stats.add(record, top);
        }
        Ok(stats)
    }

    async fn consumers(&self) -> Result<Vec<crate::admin::ConsumerCounts>> {
        let now = self.now();
        Ok(crate::admin::ConsumerCounts::tally(
            self.records().values(),
            now,
        ))
    }

    async fn count_purgeable(&self, retention: Duration) -> Result<crate::admin::PurgeCount> {
        let now = self.now();
        let mut count = crate::admin::PurgeCount::default();
        for record in self.records().values() {
            count.add(record, now, retention);
        }
        Ok(count)
    }

    async fn last_purge(&self) -> Result<Option<PurgeRun>> {
        Ok(*self
            .inner
            .last_purge
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    async fn forget(&self, key: &Key, force: bool) -> Result<crate::admin::Forgot> {
        let now = self.now();
        let mut map = self.records();
        let forgot = transition::forget(map.get(key), force, now);
        if matches!(forgot, crate::admin::Forgot::Forgot { .. }) {
            map.remove(key);
        }
        Ok(forgot)
    }

    async fn revoke(
        &self,
        key: &Key,
        token: LeaseToken,
        force: bool,
        new_token: LeaseToken,
    ) -> Result<bool> {
        let now = self.now();
        let mut map = self.records();
        match transition::revoke(map.get(key), token, force, new_token, now) {
            Some(record) => {
                map.insert(key.clone(), record);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}
