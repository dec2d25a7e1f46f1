//! [`Observed`]: a `tracing` span and `metrics` series for every store operation, plus
//! in-process [`Counts`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::metric_names as m;
use super::{Layered, StoreLayer};
use crate::store::ItemResult;
use crate::{
    Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Error, Key, Lease, PurgeOptions,
    PurgeReport, Record, Result,
};

/// What [`Observed`] puts in its spans and labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObserveOptions {
    /// The `backend` label and span field (`"sqlite"`, `"postgres"`, `"redis"`, ...).
    pub backend: &'static str,
    /// Whether spans carry the message id. Turn it off when message ids are personal data
    /// (an e-mail address, an account number). Metrics never carry it.
    pub message_ids: bool,
}

impl ObserveOptions {
    /// Options for `backend`, message ids in spans.
    pub fn new(backend: &'static str) -> Self {
        ObserveOptions {
            backend,
            message_ids: true,
        }
    }

    /// The same options without message ids in spans.
    pub fn without_message_ids(mut self) -> Self {
        self.message_ids = false;
        self
    }
}

/// Counts of what an [`Observed`] store saw, read with [`Observed::counts`]: the same
/// events as its metrics, summed over every label.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Claims that acquired a lease on its first attempt.
    pub acquired: u64,
    /// Claims that acquired a lease with attempt > 1 (takeovers and retries after release).
    pub takeovers: u64,
    /// Claims answered `InFlight`.
    pub in_flight: u64,
    /// Claims answered `Completed`: duplicates suppressed.
    pub completed: u64,
    /// Successful commits.
    pub commits: u64,
    /// Successful releases.
    pub releases: u64,
    /// Successful renewals.
    pub renewals: u64,
    /// Commits, renewals and releases answered `LeaseLost`.
    pub lease_lost: u64,
    /// Claims answered `FingerprintMismatch`.
    pub fingerprint_mismatch: u64,
    /// Records removed by purges.
    pub purged: u64,
    /// Any other error (invalid input, backend failures, ...).
    pub errors: u64,
}

/// One slot of [`Counts`] per event.
#[derive(Clone, Copy)]
enum Event {
    Acquired,
    Takeover,
    InFlight,
    Completed,
    Commit,
    Release,
    Renewal,
    LeaseLost,
    FingerprintMismatch,
    Purged,
    Error,
}

const EVENTS: usize = 11;

/// Wraps a store: each operation runs inside a `tracing` span named `dedup` (fields `op`,
/// `backend`, `consumer`, `message_id` unless turned off, `attempt`, `outcome`,
/// `duration_ms`), feeds the `metrics` listed in [`metric_names`](super::metric_names),
/// and adds to in-process [`Counts`]. A store wrapped in an [`Observer`].
///
/// Spans are at `DEBUG` level; backend failures also log a `WARN` event. Without a
/// `tracing` subscriber and a `metrics` recorder installed, the spans are skipped and the
/// metrics calls are no-ops; what remains (label strings, a clock read) cost about 1 µs
/// per claim + commit on `MemoryStore` here, against 6 µs for the operations themselves. Wrap the store the [`Inbox`](crate::Inbox) uses, and the Inbox's
/// claims, renewals and commits are counted here (a takeover is a claim acquired with
/// attempt > 1; a lost lease is a renewal or commit answered `LeaseLost`).
pub type Observed<S> = Layered<Observer, S>;

impl<S> Observed<S> {
    /// Wrap `inner`, labelled `options.backend`.
    pub fn new(inner: S, options: ObserveOptions) -> Self {
        Layered::wrap(inner, Observer::new(options))
    }

    /// The options.
    pub fn options(&self) -> &ObserveOptions {
        self.layer().options()
    }

    /// The counts so far.
    pub fn counts(&self) -> Counts {
        self.layer().counts()
    }
}

/// The layer of [`Observed`]: its options and its counts so far.
#[derive(Debug)]
pub struct Observer {
    options: ObserveOptions,
    counts: [AtomicU64; EVENTS],
}

impl Observer {
    /// A layer labelled `options.backend`, with no counts yet.
    pub fn new(options: ObserveOptions) -> Self {
        Observer {
            options,
            counts: Default::default(),
        }
    }

    /// The options.
    pub fn options(&self) -> &ObserveOptions {
        &self.options
    }

    /// The counts so far.
    pub fn counts(&self) -> Counts {
        let c = |e: Event| self.counts[e as usize].load(Ordering::Relaxed);
        Counts {
            acquired: c(Event::Acquired),
            takeovers: c(Event::Takeover),
            in_flight: c(Event::InFlight),
            completed: c(Event::Completed),
            commits: c(Event::Commit),
            releases: c(Event::Release),
            renewals: c(Event::Renewal),
            lease_lost: c(Event::LeaseLost),
            fingerprint_mismatch: c(Event::FingerprintMismatch),
            purged: c(Event::Purged),
            errors: c(Event::Error),
        }
    }

    fn span(&self, op: &'static str, key: Option<&Key>) -> tracing::Span {
        let span = tracing::debug_span!(
            "dedup",
            op,
            backend = self.options.backend,
            consumer = tracing::field::Empty,
            message_id = tracing::field::Empty,
            attempt = tracing::field::Empty,
            outcome = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        if let Some(key) = key {
            span.record("consumer", key.consumer());
            if self.options.message_ids {
                span.record("message_id", key.message_id());
            }
        }
        span
    }

    fn bump(&self, event: Event, n: u64) {
        self.counts[event as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Count one event (and its metric) for `consumer`.
    fn count(&self, event: Event, consumer: &str, op: &'static str, n: u64) {
        self.bump(event, n);
        let backend = self.options.backend;
        let consumer = consumer.to_owned();
        let claim = |outcome: &'static str| metrics::counter!(m::CLAIMS_TOTAL, "backend" => backend, "consumer" => consumer.clone(), "outcome" => outcome);
        match event {
            Event::Acquired => claim("acquired").increment(n),
            Event::Takeover => claim("takeover").increment(n),
            Event::InFlight => claim("in_flight").increment(n),
            Event::Completed => claim("completed").increment(n),
            Event::Commit => metrics::counter!(m::COMMITS_TOTAL, "backend" => backend, "consumer" => consumer).increment(n),
            Event::Release => metrics::counter!(m::RELEASES_TOTAL, "backend" => backend, "consumer" => consumer).increment(n),
            Event::Renewal => metrics::counter!(m::RENEWALS_TOTAL, "backend" => backend, "consumer" => consumer).increment(n),
            Event::LeaseLost => metrics::counter!(m::LEASE_LOST_TOTAL, "backend" => backend, "consumer" => consumer, "op" => op).increment(n),
            Event::FingerprintMismatch => metrics::counter!(m::FINGERPRINT_MISMATCH_TOTAL, "backend" => backend, "consumer" => consumer).increment(n),
            Event::Purged => metrics::counter!(m::PURGED_TOTAL, "backend" => backend).increment(n),
            Event::Error => {}
        }
    }

    /// Count an error of `op` and name it for the span.
    fn error(&self, op: &'static str, consumer: &str, e: &Error) -> &'static str {
        match e {
            Error::LeaseLost { .. } => {
                self.count(Event::LeaseLost, consumer, op, 1);
                "lease_lost"
            }
            Error::FingerprintMismatch { .. } => {
                self.count(Event::FingerprintMismatch, consumer, op, 1);
                "fingerprint_mismatch"
            }
            other => {
                let kind = error_kind(other);
                self.bump(Event::Error, 1);
                metrics::counter!(m::ERRORS_TOTAL, "backend" => self.options.backend, "op" => op, "kind" => kind).increment(1);
                if matches!(other, Error::Backend { .. }) {
                    tracing::warn!(op, backend = self.options.backend, error = %crate::error_chain(other), "dedup store operation failed");
                }
                kind
            }
        }
    }

    /// Count one claim result; the span's outcome name.
    fn claim_result(&self, op: &'static str, key: &Key, r: &Result<Claim>) -> &'static str {
        let consumer = key.consumer();
        match r {
            Ok(Claim::Acquired(lease)) if lease.attempt > 1 => {
                self.count(Event::Takeover, consumer, op, 1);
                "takeover"
            }
            Ok(Claim::Acquired(_)) => {
                self.count(Event::Acquired, consumer, op, 1);
                "acquired"
            }
            Ok(Claim::InFlight { .. }) => {
                self.count(Event::InFlight, consumer, op, 1);
                "in_flight"
            }
            Ok(Claim::Completed { .. }) => {
                self.count(Event::Completed, consumer, op, 1);
                "completed"
            }
            Err(e) => self.error(op, consumer, e),
        }
    }

    /// Count a unit result counted as `ok` on success.
    fn unit_result<T>(
        &self,
        op: &'static str,
        key: &Key,
        ok: Event,
        r: &Result<T>,
    ) -> &'static str {
        match r {
            Ok(_) => {
                self.count(ok, key.consumer(), op, 1);
                "ok"
            }
            Err(e) => self.error(op, key.consumer(), e),
        }
    }

    /// Time `fut` inside `span`, record outcome and duration on the span and the histogram.
    async fn timed<T>(
        &self,
        op: &'static str,
        span: tracing::Span,
        fut: impl Future<Output = Result<T>>,
        classify: impl FnOnce(&tracing::Span, &Result<T>) -> &'static str,
    ) -> Result<T> {
        let started = Instant::now();
        let r = fut.instrument(span.clone()).await;
        let elapsed = started.elapsed();
        let outcome = span.in_scope(|| classify(&span, &r));
        span.record("outcome", outcome);
        span.record("duration_ms", elapsed.as_secs_f64() * 1000.0);
        metrics::histogram!(m::OPERATION_DURATION_SECONDS, "backend" => self.options.backend, "op" => op)
            .record(elapsed.as_secs_f64());
        r
    }
}

/// The `kind` label of an error that is not a contract outcome.
fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::InvalidInput { .. } => "invalid_input",
        Error::Unsupported(_) => "unsupported",
        Error::Corrupt { .. } => "corrupt",
        Error::Backend {
            retryable: true, ..
        } => "backend_retryable",
        Error::Backend { .. } => "backend",
        _ => "other",
    }
}

impl<S: DedupStore> StoreLayer<S> for Observer {
    async fn claim(&self, inner: &S, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        let span = self.span("claim", Some(key));
        self.timed("claim", span, inner.claim(key, options), |span, r| {
            if let Ok(Claim::Acquired(lease)) = r {
                span.record("attempt", lease.attempt);
            }
            self.claim_result("claim", key, r)
        })
        .await
    }

    async fn claim_many(
        &self,
        inner: &S,
        requests: &[ClaimRequest],
    ) -> Result<Vec<ItemResult<Claim>>> {
        let span = self.span("claim_many", None);
        self.timed(
            "claim_many",
            span,
            inner.claim_many(requests),
            |_, r| match r {
                Ok(items) => {
                    for (req, item) in requests.iter().zip(items) {
                        self.claim_result("claim_many", &req.key, item);
                    }
                    "ok"
                }
                Err(e) => self.error(
                    "claim_many",
                    batch_consumer(requests.iter().map(|r| &r.key)),
                    e,
                ),
            },
        )
        .await
    }

    async fn renew(&self, inner: &S, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        let span = self.span("renew", Some(&lease.key));
        self.timed("renew", span, inner.renew(lease, extend_by), |_, r| {
            self.unit_result("renew", &lease.key, Event::Renewal, r)
        })
        .await
    }

    async fn commit(&self, inner: &S, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        let span = self.span("commit", Some(&lease.key));
        span.record("attempt", lease.attempt);
        self.timed("commit", span, inner.commit(lease, outcome), |_, r| {
            self.unit_result("commit", &lease.key, Event::Commit, r)
        })
        .await
    }

    async fn commit_many(
        &self,
        inner: &S,
        requests: &[CommitRequest],
    ) -> Result<Vec<ItemResult<()>>> {
        let span = self.span("commit_many", None);
        self.timed(
            "commit_many",
            span,
            inner.commit_many(requests),
            |_, r| match r {
                Ok(items) => {
                    for (req, item) in requests.iter().zip(items) {
                        self.unit_result("commit_many", &req.lease.key, Event::Commit, item);
                    }
                    "ok"
                }
                Err(e) => self.error(
                    "commit_many",
                    batch_consumer(requests.iter().map(|r| &r.lease.key)),
                    e,
                ),
            },
        )
        .await
    }

    async fn release(&self, inner: &S, lease: &Lease) -> Result<()> {
        let span = self.span("release", Some(&lease.key));
        self.timed("release", span, inner.release(lease), |_, r| {
            self.unit_result("release", &lease.key, Event::Release, r)
        })
        .await
    }

    async fn release_failed(
        &self,
        inner: &S,
        lease: &Lease,
        failure: &crate::Failure,
    ) -> Result<()> {
        let span = self.span("release", Some(&lease.key));
        self.timed(
            "release",
            span,
            inner.release_failed(lease, failure),
            |_, r| self.unit_result("release", &lease.key, Event::Release, r),
        )
        .await
    }

    async fn get(&self, inner: &S, key: &Key) -> Result<Option<Record>> {
        let span = self.span("get", Some(key));
        self.timed("get", span, inner.get(key), |_, r| match r {
            Ok(Some(_)) => "found",
            Ok(None) => "absent",
            Err(e) => self.error("get", key.consumer(), e),
        })
        .await
    }

    async fn purge(&self, inner: &S, options: &PurgeOptions) -> Result<PurgeReport> {
        let span = self.span("purge", None);
        self.timed("purge", span, inner.purge(options), |_, r| match r {
            Ok(report) => {
                self.count(Event::Purged, "", "purge", report.total());
                "ok"
            }
            Err(e) => self.error("purge", "", e),
        })
        .await
    }
}

/// The consumer a failed batch is counted under: the first request's (batches are almost
/// always one consumer's).
fn batch_consumer<'a>(mut keys: impl Iterator<Item = &'a Key>) -> &'a str {
    keys.next().map(Key::consumer).unwrap_or("")
}
