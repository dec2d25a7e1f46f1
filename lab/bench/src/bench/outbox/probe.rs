//! The PostgreSQL outbox as the relay measures see it, timing its calls.

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dedup_core::outbox::{AfterFailure, Held, OutboxEntry, OutboxQuery, OutboxStats, OutboxStore};
use dedup_core::{LeaseToken, PurgeOptions, PurgeReport};
use dedup_postgres::PostgresOutbox;
use futures::stream::BoxStream;

/// The PostgreSQL outbox as a relay sees it: with or without its `NOTIFY` wakeups (a
/// relay without them polls only), timing its `take` and `mark_sent` calls.
#[derive(Debug)]
pub(super) struct Probe {
    inner: PostgresOutbox,
    wakeups: bool,
    take_ns: AtomicU64,
    mark_ns: AtomicU64,
}

impl Probe {
    pub(super) fn new(inner: PostgresOutbox, wakeups: bool) -> Self {
        Probe {
            inner,
            wakeups,
            take_ns: AtomicU64::new(0),
            mark_ns: AtomicU64::new(0),
        }
    }

    /// Seconds spent in `take` and in `mark_sent` since the last call, and reset.
    pub(super) fn split(&self) -> (f64, f64) {
        let secs = |a: &AtomicU64| a.swap(0, AtomicOrdering::Relaxed) as f64 / 1e9;
        (secs(&self.take_ns), secs(&self.mark_ns))
    }
}

fn add_elapsed(counter: &AtomicU64, started: Instant) {
    counter.fetch_add(started.elapsed().as_nanos() as u64, AtomicOrdering::Relaxed);
}

#[async_trait]
impl OutboxStore for Probe {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn take(&self, limit: usize, hold: Duration) -> dedup_core::Result<Held> {
        let started = Instant::now();
        let held = self.inner.take(limit, hold).await;
        add_elapsed(&self.take_ns, started);
        held
    }
    async fn mark_sent(&self, token: &LeaseToken, ids: &[i64]) -> dedup_core::Result<Vec<i64>> {
        let started = Instant::now();
        let marked = self.inner.mark_sent(token, ids).await;
        add_elapsed(&self.mark_ns, started);
        marked
    }
    async fn mark_failed(
        &self,
        token: &LeaseToken,
        id: i64,
        error: &str,
        after: AfterFailure,
    ) -> dedup_core::Result<bool> {
        self.inner.mark_failed(token, id, error, after).await
    }
    async fn hand_back(&self, token: &LeaseToken, ids: &[i64]) -> dedup_core::Result<u64> {
        self.inner.hand_back(token, ids).await
    }
    async fn purge(&self, options: &PurgeOptions) -> dedup_core::Result<PurgeReport> {
        self.inner.purge(options).await
    }
    async fn stats(&self) -> dedup_core::Result<OutboxStats> {
        self.inner.stats().await
    }
    async fn stats_by_destination(
        &self,
    ) -> dedup_core::Result<Vec<dedup_core::outbox::DestinationStats>> {
        self.inner.stats_by_destination().await
    }
    async fn list(&self, query: &OutboxQuery) -> dedup_core::Result<Vec<OutboxEntry>> {
        self.inner.list(query).await
    }
    async fn retry(&self, id: i64) -> dedup_core::Result<bool> {
        self.inner.retry(id).await
    }
    async fn wakeups(
        &self,
    ) -> dedup_core::Result<Option<BoxStream<'static, dedup_core::Result<()>>>> {
        match self.wakeups {
            true => self.inner.wakeups().await,
            false => Ok(None),
        }
    }
}
