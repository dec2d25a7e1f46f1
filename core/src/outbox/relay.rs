//! [`Relay`]: takes due rows, publishes them, marks them, and keeps going.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};
use tracing::Instrument;

use super::listen::listen;
use super::relay_health::RelayHealth;
use super::{AfterFailure, Held, OutboxRow, OutboxStore, Publisher};
use crate::layers::metric_names as names;
use crate::trace::MessageTrace;
use crate::{Backoff, Result, Retention};
use crate::{BoxError, Error, TimedOut, error_chain};

/// How a [`Relay`] works. The defaults suit most services; see each field.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayConfig {
    /// Rows per take (default 100).
    pub batch_size: usize,
    /// How long a take holds its rows (default 30 s). It must outlast the publisher's
    /// [`delivery_timeout`](super::Publisher::delivery_timeout) by at least
    /// [`mark_margin`](Self::mark_margin): the relay refuses to start otherwise
    /// ([`Error::PublisherOutlastsHold`](crate::Error::PublisherOutlastsHold)). Every
    /// publisher of `dedup-brokers` fits the default with its own defaults.
    pub hold: Duration,
    /// The end of each hold kept for marking the rows after their publish (default 5 s):
    /// the relay gives a publish at most `hold - mark_margin` from the take, then counts
    /// the rows still unanswered as failed. It covers the marks' round trip and the time
    /// the take's answer took to arrive.
    pub mark_margin: Duration,
    /// How often to look for due rows when nothing wakes the relay (default 1 s). The
    /// relay is correct on polling alone; notifications only make it quicker.
    pub poll_interval: Duration,
    /// Publish attempts before a row is dead (default 10).
    pub max_attempts: u32,
    /// The delay before a failed row is due again, by attempt (default: exponential from
    /// 1 s to 5 min, with jitter).
    pub backoff: Backoff,
    /// How long [`RelayHandle::stop`] lets a round in flight finish before it hands its
    /// rows back (default 10 s).
    pub stop_grace: Duration,
    /// How often the relay reads [`OutboxStore::stats`] for its gauges (default 15 s).
    pub stats_interval: Duration,
    /// After a round that took rows but not a full batch, look again this soon instead of
    /// waiting for a wake-up or the poll interval (default 20 ms): rows whose producers
    /// committed just after the take, and whose notification a store skipped (PostgreSQL
    /// notifies from producers at most once per 5 ms), go out without waiting for the next
    /// poll.
    pub linger: Duration,
    /// Rounds one relay runs at once (default 4): while one round waits for the broker's
    /// confirms, the others take and publish further rows. The store never gives one row
    /// to two rounds, and a row of an ordering key waits while an earlier row of its key
    /// is held, so per-key order holds at any number.
    pub rounds_in_flight: usize,
    /// The purge of sent rows the relay runs beside its rounds while started (default
    /// [`Retention::default`]: sent rows, and with them their message ids, kept 7 days; a
    /// paced purge every 10 minutes). `None` turns it off. Safe on every node.
    pub retention: Option<Retention>,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            batch_size: 100,
            hold: Duration::from_secs(30),
            mark_margin: Duration::from_secs(5),
            poll_interval: Duration::from_secs(1),
            max_attempts: 10,
            backoff: Backoff::Exponential {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(300),
                jitter: true,
            },
            stop_grace: Duration::from_secs(10),
            stats_interval: Duration::from_secs(15),
            rounds_in_flight: 4,
            linger: Duration::from_millis(20),
            retention: Some(Retention::default()),
        }
    }
}

impl RelayConfig {
    /// The same configuration with `batch_size` rows per take.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }
    /// The same configuration holding taken rows for `hold`.
    pub fn hold(mut self, hold: Duration) -> Self {
        self.hold = hold;
        self
    }
    /// The same configuration keeping `margin` of each hold for the marks.
    pub fn mark_margin(mut self, margin: Duration) -> Self {
        self.mark_margin = margin;
        self
    }
    /// The same configuration polling every `every`.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }
    /// The same configuration with `n` attempts before a row is dead.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }
    /// The same configuration with another backoff.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }
    /// The same configuration running `n` rounds at once (at least 1).
    pub fn rounds_in_flight(mut self, n: usize) -> Self {
        self.rounds_in_flight = n.max(1);
        self
    }
    /// The same configuration looking again `linger` after a round that took rows.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }
    /// The same configuration purging sent rows under `retention` (`None`: never).
    pub fn retention(mut self, retention: Option<Retention>) -> Self {
        self.retention = retention;
        self
    }
    /// The same configuration with another stop grace.
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }
}

/// What one round of a relay did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayRound {
    /// Rows taken.
    pub taken: u64,
    /// Rows published and marked sent.
    pub sent: u64,
    /// Rows whose publish failed and that are due again later.
    pub failed: u64,
    /// Rows whose publish failed for the last allowed time, now dead.
    pub dead: u64,
    /// Rows published whose mark was refused because the hold had run out and another
    /// relay took them (they are published again by it).
    pub lost: u64,
    /// Rows handed back unpublished (a stop).
    pub handed_back: u64,
}

impl RelayRound {
    fn add(&mut self, other: RelayRound) {
        self.taken += other.taken;
        self.sent += other.sent;
        self.failed += other.failed;
        self.dead += other.dead;
        self.lost += other.lost;
        self.handed_back += other.handed_back;
    }
}

/// Publishes an outbox.
///
/// A relay takes due rows in batches, under a hold. It publishes them through a
/// [`Publisher`] and marks them sent. It retries failures with backoff. After
/// [`RelayConfig::max_attempts`] a row is dead; it does not hold up the rows behind it.
///
/// Run as many relays as you like, on as many nodes: the store never gives one row to two
/// live holds. Each row is published at least once. A relay may die between the publish
/// and the mark. The row is then published again when its hold runs out, with the same
/// message id, and the consumer's inbox drops the copy.
///
/// Metrics (names in [`metric_names`](crate::layers::metric_names)): published rows,
/// publish failures, dead rows, lost marks, publish time and commit-to-publish latency.
/// Gauges: pending and dead rows, and the age of the oldest unsent row. Each round is a
/// `dedup.outbox.round` span. Each row's outcome is a `dedup.outbox.publish` span (debug
/// level) with its `message_id`, `trace_id`, `correlation_id` and `causation_id` (see
/// [`crate::trace`]).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use dedup_core::outbox::{MemoryOutbox, MemoryPublisher, OutboxMessage, Relay};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dedup_core::Error> {
/// let outbox = MemoryOutbox::new();
/// let publisher = MemoryPublisher::new();
/// // A producer's transaction wrote a message.
/// outbox.enqueue(&[OutboxMessage::new("invoices", "invoice-1", b"{}".to_vec())?])?;
///
/// let relay = Relay::new(Arc::new(outbox.clone()), Arc::new(publisher.clone()));
/// // A service starts it: `let running = relay.start()?;` ... `running.stop().await;`
/// let round = relay.run_once().await?;
/// assert_eq!(round.sent, 1);
/// assert_eq!(publisher.message_ids(), ["invoice-1"]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Relay {
    store: Arc<dyn OutboxStore>,
    publisher: Arc<dyn Publisher>,
    config: RelayConfig,
    health: RelayHealth,
}

impl Relay {
    /// A relay of `store` through `publisher`, with the default [`RelayConfig`].
    pub fn new(store: Arc<dyn OutboxStore>, publisher: Arc<dyn Publisher>) -> Self {
        Relay {
            store,
            publisher,
            config: RelayConfig::default(),
            health: RelayHealth::default(),
        }
    }

    /// The same relay with another configuration.
    pub fn with_config(mut self, config: RelayConfig) -> Self {
        self.config = config;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// The relay's live state, for probes: take it before [`start`](Self::start). Clones
    /// of this relay share it.
    pub fn health(&self) -> RelayHealth {
        self.health.clone()
    }

    /// Whether the publisher's deliveries end within the hold: `delivery_timeout +
    /// mark_margin < hold` (see [`Publisher::delivery_timeout`]).
    /// [`start`](Self::start) and [`run_once`](Self::run_once) check it first.
    ///
    /// # Errors
    ///
    /// [`Error::PublisherOutlastsHold`], naming the three durations, when it does not hold.
    pub fn check(&self) -> Result<()> {
        let delivery_timeout = self.publisher.delivery_timeout();
        let RelayConfig {
            hold, mark_margin, ..
        } = self.config;
        if delivery_timeout.saturating_add(mark_margin) >= hold {
            return Err(Error::PublisherOutlastsHold {
                publisher: self.publisher.name(),
                delivery_timeout,
                mark_margin,
                hold,
            });
        }
        Ok(())
    }

    /// One round: take due rows, publish them, mark each.
    ///
    /// For tests, and for callers that drive the relay themselves.
    /// [`start`](Self::start) runs rounds in a loop.
    ///
    /// # Errors
    ///
    /// [`Error::PublisherOutlastsHold`] (see [`check`](Self::check)), before anything is
    /// taken; the store's errors.
    ///
    /// # Cancel safety
    ///
    /// A dropped round leaves the rows it took held. Once the hold runs out, another
    /// round takes them again. A row published before the drop is then published twice,
    /// with the same message id.
    pub async fn run_once(&self) -> Result<RelayRound> {
        self.check()?;
        let taken_at = Instant::now();
        let held = self
            .store
            .take(self.config.batch_size, self.config.hold)
            .await?;
        self.settle(held, None, taken_at).await
    }

    /// Run rounds in tokio tasks until [`RelayHandle::stop`]:
    /// [`RelayConfig::rounds_in_flight`] loops, each taking rounds back to back while full
    /// batches come back, otherwise waiting for a wake-up from the store or the poll
    /// interval. Store errors are logged and retried after the poll interval. Beside them,
    /// the [`RelayConfig::retention`] purge of sent rows, stopped with the relay.
    ///
    /// # Errors
    ///
    /// [`Error::PublisherOutlastsHold`] when the publisher's
    /// [`delivery_timeout`](Publisher::delivery_timeout) does not fit in the hold (see
    /// [`check`](Self::check)); nothing is started then.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (it spawns tasks).
    pub fn start(self) -> Result<RelayHandle> {
        self.check()?;
        let (stop, stopped) = watch::channel(false);
        let totals = Arc::new(Totals::default());
        self.health.set_running(true);
        let task = tokio::spawn(self.run(stopped, Arc::clone(&totals)));
        Ok(RelayHandle { stop, task, totals })
    }

    async fn run(self, stopped: watch::Receiver<bool>, totals: Arc<Totals>) -> RelayRound {
        let purger = self.config.retention.and_then(|r| {
            (r.purger().start_outbox(Arc::clone(&self.store)))
                .inspect_err(|e| tracing::warn!(error = %error_chain(e), "dedup outbox relay: the retention purge did not start; sent rows are not purged"))
                .ok()
        });
        let relay = Arc::new(self);
        let woken = Arc::new(Notify::new());
        // One task listens for the store's wake-ups and wakes every round loop.
        let listener = tokio::spawn({
            let (relay, woken, stopped) = (Arc::clone(&relay), Arc::clone(&woken), stopped.clone());
            async move {
                listen(&*relay.store, relay.config.poll_interval, &woken, stopped).await;
            }
        });
        let loops: Vec<_> = (0..relay.config.rounds_in_flight.max(1))
            .map(|n| {
                let (relay, woken, stopped, totals) = (
                    Arc::clone(&relay),
                    Arc::clone(&woken),
                    stopped.clone(),
                    Arc::clone(&totals),
                );
                tokio::spawn(async move { relay.round_loop(n == 0, woken, stopped, totals).await })
            })
            .collect();
        let mut all = RelayRound::default();
        for one in futures::future::join_all(loops).await {
            all.add(one.unwrap_or_default());
        }
        listener.abort();
        if let Some(purger) = purger {
            purger.stop().await;
        }
        relay.health.set_running(false);
        all
    }

    /// One loop of rounds: back to back while full batches come back, otherwise waiting
    /// for a wake-up or the poll interval. The first loop also reports the gauges.
    async fn round_loop(
        &self,
        reports_stats: bool,
        woken: Arc<Notify>,
        mut stopped: watch::Receiver<bool>,
        totals: Arc<Totals>,
    ) -> RelayRound {
        let mut all = RelayRound::default();
        let mut last_stats: Option<Instant> = None;
        loop {
            if *stopped.borrow() {
                return all;
            }
            if reports_stats && last_stats.is_none_or(|t| t.elapsed() >= self.config.stats_interval)
            {
                self.report_stats().await;
                last_stats = Some(Instant::now());
            }
            // Registered before the take, so a wake-up during the round is not missed.
            let wake = woken.notified();
            tokio::pin!(wake);
            wake.as_mut().enable();
            let taken_at = Instant::now();
            let round = match self
                .store
                .take(self.config.batch_size, self.config.hold)
                .await
            {
                Ok(held) => {
                    self.health.took(true);
                    self.settle(held, Some(&mut stopped), taken_at).await
                }
                Err(e) => {
                    self.health.took(false);
                    Err(e)
                }
            };
            let taken = match round {
                Ok(round) => {
                    totals.add(&round);
                    all.add(round);
                    round.taken as usize
                }
                Err(e) => {
                    tracing::warn!(error = %error_chain(&e), backend = self.store.backend(), "dedup outbox relay: round failed; trying again after the poll interval");
                    0
                }
            };
            if taken >= self.config.batch_size {
                continue;
            }
            let wait = if taken > 0 {
                self.config.linger.min(self.config.poll_interval)
            } else {
                self.config.poll_interval
            };
            tokio::select! {
                _ = stopped.changed() => return all,
                () = tokio::time::sleep(wait) => {}
                () = wake => {}
            }
        }
    }

    async fn report_stats(&self) {
        let backend = self.store.backend();
        match self.store.stats().await {
            Ok(stats) => {
                metrics::gauge!(names::OUTBOX_PENDING, "backend" => backend)
                    .set((stats.pending + stats.held) as f64);
                metrics::gauge!(names::OUTBOX_DEAD, "backend" => backend).set(stats.dead as f64);
                metrics::gauge!(names::OUTBOX_OLDEST_UNSENT_SECONDS, "backend" => backend)
                    .set(stats.oldest_unsent_age().as_secs_f64());
                self.health
                    .stats(stats.pending + stats.held, stats.oldest_unsent_age());
            }
            Err(e) => tracing::debug!(error = %error_chain(&e), "dedup outbox relay: stats failed"),
        }
    }

    /// Publish `held`'s rows (taken at `taken_at`) and mark each. The publish gets until
    /// `hold - mark_margin` after the take. With `stopped`, a stop during the publish gives
    /// it [`RelayConfig::stop_grace`] to finish, then hands the rows back.
    async fn settle(
        &self,
        held: Held,
        stopped: Option<&mut watch::Receiver<bool>>,
        taken_at: Instant,
    ) -> Result<RelayRound> {
        let mut round = RelayRound {
            taken: held.rows.len() as u64,
            ..RelayRound::default()
        };
        if held.rows.is_empty() {
            return Ok(round);
        }
        let backend = self.store.backend();
        let span = tracing::info_span!(
            "dedup.outbox.round",
            backend,
            publisher = self.publisher.name(),
            taken = held.rows.len()
        );
        async {
            let started = Instant::now();
            let budget = (self.config.hold)
                .saturating_sub(self.config.mark_margin)
                .saturating_sub(taken_at.elapsed());
            let publish = self.publish_within(&held.rows, budget);
            let results = match stopped {
                None => publish.await,
                Some(stopped) => {
                    tokio::pin!(publish);
                    let finished = tokio::select! {
                        r = &mut publish => Some(r),
                        _ = stopped.changed() => None,
                    };
                    match finished {
                        Some(r) => r,
                        None => match tokio::time::timeout(self.config.stop_grace, publish).await {
                            Ok(r) => r,
                            Err(_) => {
                                let ids: Vec<i64> = held.rows.iter().map(|r| r.id).collect();
                                round.handed_back = self.store.hand_back(&held.token, &ids).await?;
                                tracing::warn!(rows = ids.len(), "dedup outbox relay: stopped with a publish in flight; rows handed back (some may be published again)");
                                return Ok(round);
                            }
                        },
                    }
                }
            };
            metrics::histogram!(names::OUTBOX_PUBLISH_DURATION_SECONDS, "publisher" => self.publisher.name())
                .record(started.elapsed().as_secs_f64());
            let accepted = results.iter().filter(|r| r.is_ok()).count();
            self.health.published(results.len(), accepted);
            let mut ok = Vec::new();
            for (row, result) in held.rows.iter().zip(results) {
                let row_span = publish_span(row);
                let _in_row = row_span.enter();
                match result {
                    Ok(()) => {
                        row_span.record("outcome", "published");
                        ok.push(row.id);
                    }
                    Err(e) => {
                        row_span.record("outcome", "failed");
                        let after = if row.attempts >= self.config.max_attempts {
                            AfterFailure::Dead
                        } else {
                            AfterFailure::RetryAfter(self.config.backoff.delay(row.attempts))
                        };
                        let text = error_chain(&*e);
                        metrics::counter!(names::OUTBOX_PUBLISH_FAILURES_TOTAL, "publisher" => self.publisher.name(), "destination" => row.destination.clone()).increment(1);
                        if self.store.mark_failed(&held.token, row.id, &text, after).await? {
                            if after == AfterFailure::Dead {
                                round.dead += 1;
                                metrics::counter!(names::OUTBOX_DEAD_TOTAL, "destination" => row.destination.clone()).increment(1);
                                tracing::error!(id = row.id, message_id = %row.message_id, destination = %row.destination, attempts = row.attempts, error = %text, "dedup outbox: row is dead after its last attempt; `dedup outbox retry` sends it again");
                            } else {
                                round.failed += 1;
                                tracing::warn!(id = row.id, message_id = %row.message_id, destination = %row.destination, attempts = row.attempts, error = %text, "dedup outbox: publish failed; retrying later");
                            }
                        } else {
                            round.lost += 1;
                        }
                    }
                }
            }
            if !ok.is_empty() {
                let marked = self.store.mark_sent(&held.token, &ok).await?;
                round.sent = marked.len() as u64;
                round.lost += (ok.len() - marked.len()) as u64;
                let now = crate::Timestamp::from_system_time(std::time::SystemTime::now());
                for row in held.rows.iter().filter(|r| marked.contains(&r.id)) {
                    metrics::counter!(names::OUTBOX_PUBLISHED_TOTAL, "publisher" => self.publisher.name(), "destination" => row.destination.clone()).increment(1);
                    metrics::histogram!(names::OUTBOX_COMMIT_TO_PUBLISH_SECONDS, "publisher" => self.publisher.name())
                        .record(now.since(row.written_at).as_secs_f64());
                }
            }
            if round.lost > 0 {
                metrics::counter!(names::OUTBOX_LOST_MARKS_TOTAL, "backend" => backend).increment(round.lost);
                tracing::warn!(rows = round.lost, "dedup outbox relay: hold ran out before the mark; another relay publishes these rows again (raise RelayConfig::hold?)");
            }
            Ok(round)
        }
        .instrument(span)
        .await
    }
}

impl Relay {
    /// `rows` published, each answered; the rows still unanswered after `budget` count as
    /// failed (the call is dropped: the publisher's own timeout, checked against the hold,
    /// makes sure nothing of it lands later).
    async fn publish_within(
        &self,
        rows: &[OutboxRow],
        budget: Duration,
    ) -> Vec<std::result::Result<(), BoxError>> {
        match tokio::time::timeout(budget, self.publisher.publish_all(rows)).await {
            Ok(results) => results,
            Err(_) => {
                let name = self.publisher.name();
                tracing::warn!(rows = rows.len(), publisher = name, after = ?budget, "dedup outbox relay: the publisher did not answer before the end of the hold less the mark margin; the rows count as failed");
                rows.iter()
                    .map(|_| {
                        Err(Box::new(TimedOut {
                            what: format!("the {name} publisher's answer within the relay's hold"),
                            after: budget,
                        }) as BoxError)
                    })
                    .collect()
            }
        }
    }
}

/// The `dedup.outbox.publish` span of one row: its message id, destination and trace
/// fields (the row's [`MessageTrace`]), so the relay's lines of one flow share its trace
/// id.
fn publish_span(row: &super::OutboxRow) -> tracing::Span {
    let span = tracing::debug_span!(
        "dedup.outbox.publish",
        message_id = %row.message_id,
        destination = %row.destination,
        attempt = row.attempts,
        outcome = tracing::field::Empty,
        trace_id = tracing::field::Empty,
        correlation_id = tracing::field::Empty,
        causation_id = tracing::field::Empty,
    );
    if !span.is_disabled() {
        MessageTrace::from_headers(
            &row.message_id,
            row.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
        )
        .record(&span);
    }
    span
}

#[derive(Debug, Default)]
struct Totals {
    sent: AtomicU64,
    failed: AtomicU64,
    dead: AtomicU64,
}

impl Totals {
    fn add(&self, round: &RelayRound) {
        self.sent.fetch_add(round.sent, Ordering::Relaxed);
        self.failed.fetch_add(round.failed, Ordering::Relaxed);
        self.dead.fetch_add(round.dead, Ordering::Relaxed);
    }
}

/// A running relay, from [`Relay::start`].
#[derive(Debug)]
pub struct RelayHandle {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<RelayRound>,
    totals: Arc<Totals>,
}

impl RelayHandle {
    /// Rows published and marked sent so far.
    pub fn sent(&self) -> u64 {
        self.totals.sent.load(Ordering::Relaxed)
    }

    /// Rows made dead so far.
    pub fn dead(&self) -> u64 {
        self.totals.dead.load(Ordering::Relaxed)
    }

    /// Stops the relay and returns what it did in all.
    ///
    /// A round in flight finishes. After [`RelayConfig::stop_grace`] it hands its rows
    /// back instead. Dropping the handle stops the relay too, without waiting.
    ///
    /// # Cancel safety
    ///
    /// The stop is asked for at the first poll. Dropped after that, the relay still stops
    /// gracefully; nobody waits for it.
    pub async fn stop(self) -> RelayRound {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}
