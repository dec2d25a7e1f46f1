//! [`Purger`]: runs the store's purge in the background, on a jittered period, until stopped.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::outbox::OutboxStore;
use crate::{DedupStore, PurgeOptions};

/// How long a store keeps what it no longer needs, and how often a background purge removes
/// the rest: what an [`Inbox`](crate::Inbox) (and so every transactional inbox) and an
/// outbox [`Relay`](crate::outbox::Relay) run by default, without you starting a
/// [`Purger`].
///
/// The default keeps records (and sent outbox rows) 7 days and looks every 10 minutes
/// (± 20 %, so nodes started together do not purge in step), with paced batches
/// ([`Pace::default`](crate::Pace)): live traffic never waits behind more than one short
/// batch. Several nodes, and several inboxes on one store, may each run one: every batch
/// removes a record at most once. Turn it off with `retention: None`
/// ([`InboxConfig::retention`](crate::InboxConfig::retention),
/// [`RelayConfig::retention`](crate::outbox::RelayConfig::retention)), for instance when
/// one dedicated [`Purger`] or a cron `dedup purge` does the work.
///
/// Choose `keep` longer than the longest time a broker may redeliver a message (retries,
/// dead-letter replays): a duplicate arriving after its record was purged runs again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Remove completed records (sent outbox rows) processed longer ago than this, and
    /// in-flight records whose lease expired longer ago than this. Default 7 days.
    pub keep: Duration,
    /// How often the purge runs (± 20 %; the first run comes after a random part of it).
    /// Default 10 minutes.
    pub every: Duration,
}

impl Retention {
    /// The default `keep`: 7 days.
    pub const DEFAULT_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);
    /// The default `every`: 10 minutes.
    pub const DEFAULT_EVERY: Duration = Duration::from_secs(600);

    /// The [`Purger`] this retention runs.
    pub fn purger(&self) -> Purger {
        Purger::new(self.keep, self.every)
    }
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            keep: Self::DEFAULT_KEEP,
            every: Self::DEFAULT_EVERY,
        }
    }
}

/// The retention purge of one [`Inbox`](crate::Inbox) and its clones: started by the
/// first delivery handled (so only ever inside a tokio runtime, and once, not per call),
/// stopped when the last clone is dropped: that drops the [`PurgerHandle`], which stops the
/// task at its next wait (a run in progress finishes first).
#[derive(Debug, Default)]
pub(crate) struct Background {
    tried: AtomicBool,
    running: Mutex<Option<PurgerHandle>>,
}

impl Background {
    /// Start purging `store` under `retention` unless this was tried before. Settings the
    /// [`Purger`] refuses (a retention shorter than `lease`) are logged at `WARN`, once.
    pub(crate) fn start<S: DedupStore + ?Sized + 'static>(
        &self,
        store: &Arc<S>,
        retention: Option<Retention>,
        lease: Duration,
    ) {
        if self.tried.load(Ordering::Acquire) {
            return;
        }
        let Some(retention) = retention else {
            self.tried.store(true, Ordering::Release);
            return;
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if self.tried.swap(true, Ordering::AcqRel) {
            return;
        }
        match retention
            .purger()
            .longest_lease(lease)
            .start(Arc::clone(store))
        {
            Ok(handle) => *running = Some(handle),
            Err(e) => tracing::warn!(
                error = %crate::error_chain(&e),
                "dedup inbox: the retention purge did not start; nothing is purged (fix InboxConfig::retention)"
            ),
        }
    }
}

/// Why a [`Purger`] refused to start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PurgerError {
    /// The retention is shorter than the longest lease: a purge could remove an in-flight
    /// record whose worker is still about to commit (its lease expired a moment ago and
    /// nobody took it over yet), and the next delivery would run the handler again.
    #[error(
        "retention {retention:?} is shorter than the longest lease {longest_lease:?}: in-flight records could be purged under a worker that is still committing"
    )]
    RetentionShorterThanLease {
        /// The retention asked for.
        retention: Duration,
        /// The longest lease declared with [`Purger::longest_lease`].
        longest_lease: Duration,
    },
    /// The period or the options are unusable (a zero period, a batch size out of range).
    #[error("invalid purger settings")]
    Invalid(#[source] crate::Error),
}

/// Something a [`Purger`] started with but wants you to know (also logged at `WARN`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PurgerWarning {
    /// The retention is shorter than the declared redelivery window: a duplicate that the
    /// broker delivers after its record was purged is processed again.
    RetentionShorterThanRedelivery {
        /// The retention.
        retention: Duration,
        /// The window declared with [`Purger::redelivery_window`].
        redelivery_window: Duration,
    },
}

/// A background purge of a store, on a jittered period, until stopped.
///
/// Every `every` it calls the store's [`purge`](DedupStore::purge) with `retention`. The
/// period varies by a jitter, so many nodes do not purge in step. It logs what it removed
/// (`tracing`: `INFO` when something was, `DEBUG` otherwise, `WARN` on failure). It adds
/// the count to [`PurgerHandle::removed`].
///
/// You rarely need one: an [`Inbox`](crate::Inbox) runs a [`Retention`] purge by default.
/// Start a `Purger` when one dedicated node (or a cron `dedup purge`) does the work.
///
/// It is safe to run on every node at once. Each purge batch removes a record at most
/// once: every backend deletes with one atomic statement or script per batch. The first
/// run comes after a random part of the period, which spreads nodes started together. A
/// failed run is logged and retried at the next period. For a `dedup_purged_total`
/// metric, give it a store wrapped in [`Observed`](crate::layers::Observed).
///
/// # Examples
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use dedup_core::{MemoryStore, Purger};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dedup_core::PurgerError> {
/// let store = Arc::new(MemoryStore::new());
/// let week = Duration::from_secs(7 * 24 * 3600);
/// let purger = Purger::new(week, Duration::from_secs(600))
///     .longest_lease(Duration::from_secs(30))
///     .redelivery_window(Duration::from_secs(4 * 24 * 3600))
///     .start(store)?;
/// // ... serve ...
/// let stats = purger.stop().await;
/// assert_eq!(stats.removed, 0);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Purger {
    options: PurgeOptions,
    every: Duration,
    jitter: f64,
    longest_lease: Option<Duration>,
    redelivery_window: Option<Duration>,
}

impl Purger {
    /// A purger removing records older than `retention`, every `every` (± 20 %).
    ///
    /// It uses [`PurgeOptions::older_than`]: paced batches
    /// ([`Pace::default`](crate::Pace)). A run never makes claims wait behind more than one
    /// short batch. Nothing runs until [`start`](Self::start).
    pub fn new(retention: Duration, every: Duration) -> Self {
        Purger {
            options: PurgeOptions::older_than(retention),
            every,
            jitter: 0.2,
            longest_lease: None,
            redelivery_window: None,
        }
    }

    /// Starts a purger with the defaults of [`Purger::new`] over `store`.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start): outside a tokio runtime.
    pub fn spawn<S: DedupStore + ?Sized + 'static>(
        store: Arc<S>,
        retention: Duration,
        every: Duration,
    ) -> Result<PurgerHandle, PurgerError> {
        Purger::new(retention, every).start(store)
    }

    /// The longest lease any worker of this store takes: [`start`](Self::start) refuses a
    /// retention shorter than it.
    pub fn longest_lease(mut self, lease: Duration) -> Self {
        self.longest_lease = Some(lease);
        self
    }

    /// How long after a message's first delivery the broker may still redeliver it (its
    /// retry schedule, DLQ replays): [`start`](Self::start) warns when retention is shorter.
    pub fn redelivery_window(mut self, window: Duration) -> Self {
        self.redelivery_window = Some(window);
        self
    }

    /// The purge options of each run (retention included; its batch size and batch limit
    /// bound one run's work).
    pub fn options(mut self, options: PurgeOptions) -> Self {
        self.options = options;
        self
    }

    /// The share of the period each wait may be longer or shorter by (0 to 1; default 0.2).
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter.clamp(0.0, 1.0);
        self
    }

    /// Checks the settings without starting anything.
    ///
    /// It answers the warnings [`start`](Self::start) would log.
    ///
    /// # Errors
    ///
    /// - [`PurgerError::RetentionShorterThanLease`]: the retention is shorter than
    ///   [`longest_lease`](Self::longest_lease).
    /// - [`PurgerError::Invalid`]: a zero period, or unusable [`options`](Self::options).
    pub fn check(&self) -> Result<Vec<PurgerWarning>, PurgerError> {
        self.options.validate().map_err(PurgerError::Invalid)?;
        if self.every.is_zero() {
            return Err(PurgerError::Invalid(crate::Error::invalid(
                "purge period",
                "must be longer than zero",
            )));
        }
        let retention = self.options.retention;
        if let Some(longest_lease) = self.longest_lease
            && retention < longest_lease
        {
            return Err(PurgerError::RetentionShorterThanLease {
                retention,
                longest_lease,
            });
        }
        Ok(self
            .redelivery_window
            .filter(|w| retention < *w)
            .map(
                |redelivery_window| PurgerWarning::RetentionShorterThanRedelivery {
                    retention,
                    redelivery_window,
                },
            )
            .into_iter()
            .collect())
    }

    /// Starts purging `store` in a tokio task.
    ///
    /// It logs the warnings of [`check`](Self::check). Stop it with
    /// [`PurgerHandle::stop`], or drop the handle.
    ///
    /// # Errors
    ///
    /// The errors of [`check`](Self::check). Nothing is started then.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (it calls `tokio::spawn`).
    pub fn start<S: DedupStore + ?Sized + 'static>(
        self,
        store: Arc<S>,
    ) -> Result<PurgerHandle, PurgerError> {
        self.start_target(Box::new(Inbox(store)))
    }

    /// Starts purging the sent rows of an outbox in a tokio task.
    ///
    /// It uses the same retention, period, jitter and pacing. The retention is how long
    /// sent rows, and with them their message ids, are kept. An id enqueued again within
    /// it is still dropped. Several nodes may run one each. A started
    /// [`Relay`](crate::outbox::Relay) runs one by default.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start): outside a tokio runtime.
    pub fn start_outbox(self, outbox: Arc<dyn OutboxStore>) -> Result<PurgerHandle, PurgerError> {
        self.start_target(Box::new(Outbox(outbox)))
    }

    fn start_target(self, target: Box<dyn Target>) -> Result<PurgerHandle, PurgerError> {
        let warnings = self.check()?;
        for w in &warnings {
            tracing::warn!(warning = ?w, "dedup purger: retention is shorter than the redelivery window; late duplicates will be processed again");
        }
        let removed = Arc::new(AtomicU64::new(0));
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(self.run(target, Arc::clone(&removed), stopped));
        Ok(PurgerHandle {
            stop,
            task,
            removed,
            warnings,
        })
    }

    async fn run(
        self,
        target: Box<dyn Target>,
        removed: Arc<AtomicU64>,
        mut stopped: watch::Receiver<bool>,
    ) -> PurgerStats {
        let mut stats = PurgerStats::default();
        let mut wait = self.every.mul_f64(random_unit());
        loop {
            tokio::select! {
                _ = stopped.changed() => return stats,
                () = tokio::time::sleep(wait) => {}
            }
            // A run in progress finishes before a stop takes effect (bound it with
            // `PurgeOptions::max_batches`).
            let started = std::time::Instant::now();
            match target.purge(&self.options).await {
                Ok(report) => {
                    stats.runs += 1;
                    stats.removed += report.total();
                    removed.fetch_add(report.total(), Ordering::Relaxed);
                    if report.total() > 0 {
                        tracing::info!(
                            removed = report.total(),
                            completed = report.completed,
                            expired = report.expired,
                            batches = report.batches,
                            elapsed_ms = started.elapsed().as_millis() as u64,
                            what = target.what(),
                            "dedup purger removed old records"
                        );
                    } else {
                        tracing::debug!(
                            batches = report.batches,
                            what = target.what(),
                            "dedup purger: nothing to remove"
                        );
                    }
                }
                Err(e) => {
                    stats.failures += 1;
                    tracing::warn!(error = %crate::error_chain(&e), "dedup purge failed; retrying next period");
                }
            }
            wait = jittered(self.every, self.jitter, random_unit());
        }
    }
}

/// What a purger purges: an inbox's records or an outbox's sent rows.
#[async_trait::async_trait]
trait Target: Send + Sync {
    async fn purge(&self, options: &PurgeOptions) -> crate::Result<crate::PurgeReport>;
    fn what(&self) -> &'static str;
}

struct Inbox<S: ?Sized>(Arc<S>);

#[async_trait::async_trait]
impl<S: DedupStore + ?Sized + 'static> Target for Inbox<S> {
    async fn purge(&self, options: &PurgeOptions) -> crate::Result<crate::PurgeReport> {
        self.0.purge(options).await
    }
    fn what(&self) -> &'static str {
        "inbox"
    }
}

struct Outbox(Arc<dyn OutboxStore>);

#[async_trait::async_trait]
impl Target for Outbox {
    async fn purge(&self, options: &PurgeOptions) -> crate::Result<crate::PurgeReport> {
        self.0.purge(options).await
    }
    fn what(&self) -> &'static str {
        "outbox"
    }
}

/// `every`, longer or shorter by up to `jitter` of it: `unit` 0 gives the shortest wait,
/// 0.5 `every` itself, and values near 1 the longest.
fn jittered(every: Duration, jitter: f64, unit: f64) -> Duration {
    every.mul_f64(1.0 + jitter * (2.0 * unit - 1.0))
}

/// A uniformly random number in [0, 1), from the operating system's randomness.
fn random_unit() -> f64 {
    (uuid::Uuid::new_v4().as_u128() >> 75) as f64 / (1u64 << 53) as f64
}

/// What a purger did, returned by [`PurgerHandle::stop`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PurgerStats {
    /// Purge runs that succeeded.
    pub runs: u64,
    /// Purge runs that failed.
    pub failures: u64,
    /// Records removed in all.
    pub removed: u64,
}

/// A running [`Purger`]. Stop it with [`stop`](Self::stop) (which waits for a run in
/// progress and returns what it did); dropping the handle stops it too, without waiting.
#[derive(Debug)]
pub struct PurgerHandle {
    stop: watch::Sender<bool>,
    task: JoinHandle<PurgerStats>,
    removed: Arc<AtomicU64>,
    warnings: Vec<PurgerWarning>,
}

impl PurgerHandle {
    /// Records removed so far.
    pub fn removed(&self) -> u64 {
        self.removed.load(Ordering::Relaxed)
    }

    /// The warnings it started with.
    pub fn warnings(&self) -> &[PurgerWarning] {
        &self.warnings
    }

    /// Stops it: a run in progress finishes first. Returns what it did.
    ///
    /// # Panics
    ///
    /// If the purge task panicked, the panic continues here.
    ///
    /// # Cancel safety
    ///
    /// The stop is asked for at the first poll. Dropping the future after that still
    /// stops the purger, without waiting for it.
    pub async fn stop(self) -> PurgerStats {
        let _ = self.stop.send(true);
        match self.task.await {
            Ok(stats) => stats,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => PurgerStats {
                removed: self.removed.load(Ordering::Relaxed),
                ..PurgerStats::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_wait_is_the_period_give_or_take_the_jitter() {
        let every = Duration::from_secs(10);
        assert_eq!(jittered(every, 0.2, 0.0), Duration::from_secs(8));
        assert_eq!(jittered(every, 0.2, 0.5), every);
        assert_eq!(jittered(every, 0.2, 0.75), Duration::from_secs(11));
        assert_eq!(jittered(every, 0.0, 0.9), every);
    }

    #[test]
    fn random_units_spread_over_zero_to_one() {
        let draws: Vec<f64> = (0..200).map(|_| random_unit()).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)), "{draws:?}");
        // 200 draws all in one half, or all equal, would be a broken generator.
        assert!(draws.iter().any(|u| *u < 0.5) && draws.iter().any(|u| *u >= 0.5));
    }
}
