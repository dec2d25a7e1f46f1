//! The flow: counts the console samples itself, and the per-minute figures it draws
//! from them.
//!
//! The store keeps no history of its counts, only each record's state. So the console
//! reads the counts it shows on the overview (`Admin::consumers`, `OutboxStore::stats`)
//! every [`Flow::every`] into a ring of the last hour, and also keeps the counts each
//! overview request read. Processed per minute is how much the processed count grew
//! between two samples, put in the minute of the later one. A purge or a forget between
//! two samples takes its records off that growth, and a console restart starts the
//! ring empty. Consumers pay nothing on their write path: the cost is one counts read
//! per sample (cheap with kept counts, a scan without).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use dedup_brokers::backlog::Backlog;
use dedup_core::error_chain;

use crate::model::{BacklogFlow, ConsumerFlow, Flow as FlowModel, OutboxFlow, Overview};
use crate::state::Inner;

/// Minutes the flow covers.
pub const MINUTES: usize = 60;

const MINUTE_MS: i64 = 60_000;

/// Samples kept at most (a sample every 5 s for an hour, and some).
const MAX_SAMPLES: usize = 1000;

/// Overview requests closer than this to the last sample add none.
const MIN_GAP_MS: i64 = 5_000;

/// How long one broker's backlog read may take.
const BACKLOG_TIMEOUT: Duration = Duration::from_secs(5);

/// Per consumer: processed, and failed plus dead-lettered.
type Counts = BTreeMap<String, (u64, u64)>;

/// One reading of the counts.
#[derive(Clone, Debug, Default)]
struct Sample {
    /// When, by the console's clock (ms since the epoch).
    at: i64,
    /// Per consumer: processed, and failed plus dead-lettered (`None`: not read).
    consumers: Option<Counts>,
    /// The outbox: rows waiting (pending and held), and the lag in ms.
    outbox: Option<(u64, u64)>,
    /// Each broker backlog read: its name, what it counts, and the reading.
    backlogs: Vec<(String, &'static str, u64)>,
}

/// The console's flow: how often it samples, the brokers it asks, and the samples.
#[derive(Clone)]
pub(crate) struct Flow {
    /// How often the console samples by itself (zero: only overview requests sample).
    pub(crate) every: Duration,
    /// The brokers' backlogs read at each sample.
    pub(crate) backlogs: Vec<Arc<dyn Backlog>>,
    ring: Arc<Mutex<VecDeque<Sample>>>,
    started: Arc<AtomicBool>,
}

impl Default for Flow {
    fn default() -> Self {
        Flow {
            every: Duration::from_secs(60),
            backlogs: Vec::new(),
            ring: Arc::default(),
            started: Arc::default(),
        }
    }
}

fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

impl Flow {
    fn push(&self, sample: Sample) {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        ring.push_back(sample);
        // One sample older than the window stays: the first minute's baseline.
        let oldest = now_ms() - (MINUTES as i64 + 1) * MINUTE_MS;
        while ring.len() > MAX_SAMPLES || ring.get(1).is_some_and(|s| s.at < oldest) {
            ring.pop_front();
        }
    }

    /// Keep the counts an overview request read, unless a sample is recent.
    pub(crate) fn record(&self, o: &Overview) {
        let at = now_ms();
        let recent = {
            let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
            ring.back().is_some_and(|s| at - s.at < MIN_GAP_MS)
        };
        if recent {
            return;
        }
        let consumers = o
            .consumers
            .iter()
            .map(|c| {
                (
                    c.consumer.clone(),
                    (c.processed, c.failed + c.dead_lettered),
                )
            })
            .collect();
        self.push(Sample {
            at,
            consumers: Some(consumers),
            outbox: o.outbox.as_ref().map(|x| (x.pending + x.held, x.lag_ms)),
            backlogs: Vec::new(),
        });
    }

    /// The per-minute figures of the last hour, from the samples kept.
    pub(crate) fn figures(&self) -> FlowModel {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        figures(ring.make_contiguous(), now_ms(), self.every)
    }
}

/// Start the sampling task of `inner` (once, inside a tokio runtime, when sampling is
/// on). It holds the state weakly: it ends once every router and console is dropped.
pub(crate) fn start(inner: &Arc<Inner>) {
    let flow = &inner.flow;
    if flow.every.is_zero() || flow.started.swap(true, Ordering::SeqCst) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        flow.started.store(false, Ordering::SeqCst);
        return;
    };
    let weak: Weak<Inner> = Arc::downgrade(inner);
    let every = flow.every;
    runtime.spawn(async move {
        loop {
            let Some(inner) = weak.upgrade() else { return };
            let sample = sample(&inner).await;
            inner.flow.push(sample);
            drop(inner);
            tokio::time::sleep(every).await;
        }
    });
}

/// Read the counts, the outbox's and the brokers' now.
async fn sample(inner: &Inner) -> Sample {
    let at = now_ms();
    let consumers = match inner.admin.consumers().await {
        Ok(list) => Some(
            list.into_iter()
                .map(|c| {
                    let failed = c.counts.failed + c.counts.dead_lettered;
                    (c.consumer, (c.counts.completed, failed))
                })
                .collect(),
        ),
        Err(e) => {
            tracing::debug!(error = %error_chain(&e), "dedup console: flow sample of the store failed");
            None
        }
    };
    let outbox = match &inner.outbox {
        Some(o) => match o.stats().await {
            Ok(s) => {
                let lag = u64::try_from(s.oldest_unsent_age().as_millis()).unwrap_or(u64::MAX);
                Some((s.pending + s.held, lag))
            }
            Err(e) => {
                tracing::debug!(error = %error_chain(&e), "dedup console: flow sample of the outbox failed");
                None
            }
        },
        None => None,
    };
    let reads = inner.flow.backlogs.iter().map(|b| async move {
        match tokio::time::timeout(BACKLOG_TIMEOUT, b.backlog()).await {
            Ok(Ok(n)) => Some((b.name().to_owned(), b.what(), n)),
            Ok(Err(e)) => {
                tracing::debug!(backlog = b.name(), error = %error_chain(&e), "dedup console: a broker's backlog read failed");
                None
            }
            Err(_) => None,
        }
    });
    let backlogs = futures::future::join_all(reads)
        .await
        .into_iter()
        .flatten()
        .collect();
    Sample {
        at,
        consumers,
        outbox,
        backlogs,
    }
}

/// The minute of the last hour `at` falls in (`None`: before it).
fn minute(since: i64, at: i64) -> Option<usize> {
    let i = usize::try_from((at - since).div_euclid(MINUTE_MS)).ok()?;
    (i < MINUTES).then_some(i)
}

/// The per-minute figures of `samples` (oldest first) for the hour ending with the
/// minute of `now`.
fn figures(samples: &[Sample], now: i64, every: Duration) -> FlowModel {
    let since = (now.div_euclid(MINUTE_MS) + 1) * MINUTE_MS - MINUTES as i64 * MINUTE_MS;
    let mut covered = [false; MINUTES];
    let mut growth: BTreeMap<String, ([u64; MINUTES], [u64; MINUTES])> = BTreeMap::new();
    let read: Vec<(i64, &Counts)> = samples
        .iter()
        .filter_map(|s| s.consumers.as_ref().map(|c| (s.at, c)))
        .collect();
    for pair in read.windows(2) {
        let ((_, before), (at, after)) = (pair[0], pair[1]);
        let Some(m) = minute(since, at) else { continue };
        covered[m] = true;
        for (name, &(processed, failed)) in after {
            let (p0, f0) = before.get(name).copied().unwrap_or_default();
            let (p, f) = growth
                .entry(name.clone())
                .or_insert(([0; MINUTES], [0; MINUTES]));
            p[m] += processed.saturating_sub(p0);
            f[m] += failed.saturating_sub(f0);
        }
    }
    let per_minute = |v: &[u64; MINUTES]| -> Vec<Option<u64>> {
        v.iter()
            .zip(covered)
            .map(|(&n, c)| c.then_some(n))
            .collect()
    };
    let consumers = growth
        .iter()
        .map(|(name, (p, f))| ConsumerFlow {
            consumer: name.clone(),
            processed: per_minute(p),
            failed: per_minute(f),
        })
        .collect();
    let mut lag = [None::<u64>; MINUTES];
    let mut waiting = [None::<u64>; MINUTES];
    let mut backlogs: BTreeMap<(String, &'static str), [Option<u64>; MINUTES]> = BTreeMap::new();
    for s in samples {
        let Some(m) = minute(since, s.at) else {
            continue;
        };
        if let Some((w, l)) = s.outbox {
            lag[m] = Some(lag[m].map_or(l, |x| x.max(l)));
            waiting[m] = Some(w);
        }
        for (name, what, n) in &s.backlogs {
            backlogs
                .entry((name.clone(), what))
                .or_insert([None; MINUTES])[m] = Some(*n);
        }
    }
    let outbox = samples
        .iter()
        .any(|s| s.outbox.is_some())
        .then(|| OutboxFlow {
            lag_ms: lag.to_vec(),
            waiting: waiting.to_vec(),
        });
    FlowModel {
        source: "sampled",
        sample_every_ms: u64::try_from(every.as_millis()).unwrap_or(u64::MAX),
        since,
        minute_ms: MINUTE_MS,
        samples: samples.len(),
        first_sample_at: samples.first().map(|s| s.at),
        consumers,
        outbox,
        brokers: backlogs
            .into_iter()
            .map(|((name, what), v)| BacklogFlow {
                name,
                what,
                waiting: v.to_vec(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(minute: i64, consumers: &[(&str, u64, u64)]) -> Sample {
        Sample {
            at: minute * MINUTE_MS + 1_000,
            consumers: Some(
                consumers
                    .iter()
                    .map(|&(c, p, f)| (c.to_owned(), (p, f)))
                    .collect(),
            ),
            outbox: Some((minute as u64, 10 * minute as u64)),
            backlogs: vec![("orders".into(), "queue depth", 3)],
        }
    }

    #[test]
    fn growth_between_samples_lands_in_the_later_minute() {
        let now = 100 * MINUTE_MS + 30_000;
        let samples = [
            at(98, &[("billing", 10, 1)]),
            at(99, &[("billing", 15, 1), ("shipping", 2, 0)]),
            at(100, &[("billing", 12, 3), ("shipping", 2, 0)]),
        ];
        let f = figures(&samples, now, Duration::from_secs(60));
        assert_eq!(f.since, 41 * MINUTE_MS);
        let billing = &f.consumers[0];
        assert_eq!(billing.consumer, "billing");
        assert_eq!(billing.processed[57], None, "no sample pair ends there");
        assert_eq!(billing.processed[58], Some(5));
        // A purge took 3 off: the growth is never negative.
        assert_eq!(billing.processed[59], Some(0));
        assert_eq!(billing.failed[59], Some(2));
        assert_eq!(
            f.consumers[1].processed[58],
            Some(2),
            "new: counted from zero"
        );
        let outbox = f.outbox.expect("outbox sampled");
        assert_eq!(outbox.lag_ms[59], Some(1000));
        assert_eq!(f.brokers[0].waiting[59], Some(3));
    }
}
