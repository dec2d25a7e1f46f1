//! Helpers shared by the core tests: a store clock that follows tokio's (paused) time, a
//! store that fails on demand, and readers of a `metrics` debugging snapshot.
#![allow(dead_code)] // each test binary uses a part

pub mod warnings;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, Clock, CommitRequest, DedupStore, Error,
    ItemResult, Key, Lease, MemoryStore, PurgeOptions, PurgeReport, Record, Result, Timestamp,
};
use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, Snapshotter};

/// Store time = tokio's virtual time (paused in these tests), so "slow" handlers take no
/// real time.
#[derive(Debug)]
pub struct TokioClock(tokio::time::Instant);

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(1_000_000).saturating_add(self.0.elapsed())
    }
}

/// A MemoryStore on tokio's clock.
pub fn tokio_store() -> MemoryStore {
    MemoryStore::with_clock(Arc::new(TokioClock(tokio::time::Instant::now())))
}

/// A MemoryStore whose next `fail` operations fail with a (retryable or not) backend error.
pub struct Flaky {
    pub inner: MemoryStore,
    pub fail: AtomicU32,
    pub retryable: bool,
}

impl Flaky {
    fn check(&self) -> Result<()> {
        if self
            .fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
            return Err(Error::backend("flaky", self.retryable, io));
        }
        Ok(())
    }
}

#[async_trait]
impl DedupStore for Flaky {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        self.check()?;
        self.inner.claim(key, options).await
    }
    async fn claim_many(&self, r: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        self.check()?;
        self.inner.claim_many(r).await
    }
    async fn renew(&self, lease: &Lease, d: Duration) -> Result<Lease> {
        self.check()?;
        self.inner.renew(lease, d).await
    }
    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        self.check()?;
        self.inner.commit(lease, outcome).await
    }
    async fn commit_many(&self, r: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        self.check()?;
        self.inner.commit_many(r).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.check()?;
        self.inner.release(lease).await
    }
    async fn release_failed(&self, lease: &Lease, failure: &dedup_core::Failure) -> Result<()> {
        self.check()?;
        self.inner.release_failed(lease, failure).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        self.check()?;
        self.inner.get(key).await
    }
    async fn purge(&self, o: &PurgeOptions) -> Result<PurgeReport> {
        self.check()?;
        self.inner.purge(o).await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

pub fn flaky(fail: u32, retryable: bool) -> Flaky {
    Flaky {
        inner: MemoryStore::new(),
        fail: AtomicU32::new(fail),
        retryable,
    }
}

/// Whether a metric's labels include every `(name, value)` of `labels`.
fn has_labels(key: &metrics::Key, labels: &[(&str, &str)]) -> bool {
    labels
        .iter()
        .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
}

/// Run `scenario` to completion on a current-thread runtime with paused time and a
/// debugging recorder of its own: its output, and the metrics it recorded.
pub fn recorded<F: std::future::Future>(scenario: impl FnOnce() -> F) -> (F::Output, Recorded) {
    recorded_live(|_| scenario())
}

/// [`recorded`], with a snapshotter of the recorder for the scenario to read the metrics
/// while it runs.
pub fn recorded_live<F: std::future::Future>(
    scenario: impl FnOnce(Snapshotter) -> F,
) -> (F::Output, Recorded) {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let live = snapshotter.clone();
    let out = metrics::with_local_recorder(&recorder, || runtime.block_on(scenario(live)));
    (out, Recorded::take(&snapshotter))
}

/// The metrics a debugging recorder held at one instant (taking a snapshot resets its
/// counters, so take one and query it).
pub struct Recorded(Vec<(CompositeKey, DebugValue)>);

impl Recorded {
    /// Take the snapshot.
    pub fn take(snap: &Snapshotter) -> Self {
        Recorded(
            snap.snapshot()
                .into_vec()
                .into_iter()
                .map(|(k, _, _, v)| (k, v))
                .collect(),
        )
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a DebugValue> {
        self.0
            .iter()
            .filter(move |(k, _)| k.key().name() == name && has_labels(k.key(), labels))
            .map(|(_, v)| v)
    }

    /// The sum of the counters `name` whose labels include `labels`.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.matching(name, labels)
            .map(|v| match v {
                DebugValue::Counter(n) => *n,
                other => panic!("{name} is not a counter: {other:?}"),
            })
            .sum()
    }

    /// The value of the gauge `name` whose labels include `labels`, if it was ever set.
    pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.matching(name, labels).next().map(|v| match v {
            DebugValue::Gauge(g) => g.into_inner(),
            other => panic!("{name} is not a gauge: {other:?}"),
        })
    }

    /// How many values the histograms `name` whose labels include `labels` recorded.
    pub fn observations(&self, name: &str, labels: &[(&str, &str)]) -> usize {
        self.matching(name, labels)
            .map(|v| match v {
                DebugValue::Histogram(values) => values.len(),
                other => panic!("{name} is not a histogram: {other:?}"),
            })
            .sum()
    }
}
