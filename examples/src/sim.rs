//! The delivery simulation behind the main demo: an at-least-once broker, a payment
//! provider whose charge is not idempotent (unless given an idempotency key), and two
//! consumers run on the same delivery stream: the naive check-then-act one and the dedup one.
//!
//! What the broker does, as real brokers do:
//! - the publisher retries, so some messages are published twice (`duplicate_rate`);
//! - a worker may crash after the charge and before the ack (`crash_rate`): half of the
//!   crashes happen before the consumer recorded the message as processed, half after;
//!   the broker redelivers an unacknowledged message after `redeliver_after`;
//! - a message another worker is still processing (`Busy`) is requeued with a delay.
//!
//! Crash decisions are drawn from the seed, the message and its delivery number, so both
//! consumers see the same stream of duplicates and crashes.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dedup_core::{Claim, ClaimOptions, DedupStore, Key};

use crate::rng::Rng;

/// The knobs of one simulation run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Distinct messages published.
    pub messages: usize,
    /// Probability that the publisher sends a message twice.
    pub duplicate_rate: f64,
    /// Probability that a worker crashes after the charge and before the ack.
    pub crash_rate: f64,
    /// Concurrent workers.
    pub workers: usize,
    /// Seed of the delivery stream.
    pub seed: u64,
    /// The dedup consumer's lease (a crashed worker's key is taken over after it).
    pub lease: Duration,
    /// How long the broker waits before redelivering an unacknowledged message.
    pub redeliver_after: Duration,
    /// How long a charge takes at the payment provider.
    pub payment_latency: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            messages: 1000,
            duplicate_rate: 0.2,
            crash_rate: 0.05,
            workers: 8,
            seed: 42,
            lease: Duration::from_millis(500),
            redeliver_after: Duration::from_millis(100),
            payment_latency: Duration::from_millis(2),
        }
    }
}

/// What one consumer did with the stream.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SimReport {
    /// `naive` or `dedup`.
    pub consumer: String,
    /// Distinct messages published.
    pub messages: u64,
    /// Deliveries handed to workers (first deliveries, duplicates, redeliveries).
    pub deliveries: u64,
    /// Deliveries acknowledged or requeued without charging, because the message was
    /// already processed or in progress.
    pub duplicates_suppressed: u64,
    /// Worker crashes simulated.
    pub crashes: u64,
    /// Charges the payment provider actually made.
    pub side_effects: u64,
    /// Messages charged more than once.
    pub doubled: u64,
    /// Messages never charged.
    pub lost: u64,
    /// Wall-clock time of the run, in milliseconds.
    pub time_ms: u64,
}

/// A payment provider: each call without an idempotency key charges; calls repeating a
/// key return the first charge (as Stripe and most payment APIs do).
#[derive(Debug, Default)]
struct PaymentProvider {
    charges: Mutex<HashMap<u64, u64>>,
    seen_keys: Mutex<HashSet<String>>,
}

impl PaymentProvider {
    async fn charge(&self, latency: Duration, message: u64, idempotency_key: Option<String>) {
        tokio::time::sleep(latency).await;
        if let Some(k) = idempotency_key
            && !self.seen_keys.lock().expect("lock").insert(k)
        {
            return; // a retry of a charge already made
        }
        *self
            .charges
            .lock()
            .expect("lock")
            .entry(message)
            .or_default() += 1;
    }
}

#[derive(Clone, Copy, Debug)]
struct Delivery {
    message: u64,
    /// 1 for the first delivery of this copy, +1 per redelivery.
    number: u32,
    /// Which published copy (0, or 1 for the publisher's duplicate).
    copy: u32,
}

/// The broker: a queue, delayed redelivery, and a count of copies not yet acknowledged.
struct Broker {
    queue: Mutex<VecDeque<Delivery>>,
    unacked: AtomicU64,
    deliveries: AtomicU64,
    redeliver_after: Duration,
}

impl Broker {
    fn publish(cfg: &SimConfig) -> Arc<Self> {
        let mut rng = Rng::new(cfg.seed);
        let mut queue = VecDeque::new();
        for m in 0..cfg.messages as u64 {
            queue.push_back(Delivery {
                message: m,
                number: 1,
                copy: 0,
            });
            if rng.chance(cfg.duplicate_rate) {
                // The publisher's retry lands among the next few messages, so the two
                // copies are often handled by two workers at the same time.
                let back = rng.below(queue.len().min(8) as u64) as usize;
                queue.insert(
                    queue.len() - back,
                    Delivery {
                        message: m,
                        number: 1,
                        copy: 1,
                    },
                );
            }
        }
        Arc::new(Broker {
            unacked: AtomicU64::new(queue.len() as u64),
            queue: Mutex::new(queue),
            deliveries: AtomicU64::new(0),
            redeliver_after: cfg.redeliver_after,
        })
    }

    /// The next delivery; `None` once every copy is acknowledged.
    async fn next(&self) -> Option<Delivery> {
        loop {
            if self.unacked.load(Ordering::SeqCst) == 0 {
                return None;
            }
            let next = self.queue.lock().expect("lock").pop_front();
            match next {
                Some(d) => {
                    self.deliveries.fetch_add(1, Ordering::Relaxed);
                    return Some(d);
                }
                None => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
    }

    fn ack(&self) {
        self.unacked.fetch_sub(1, Ordering::SeqCst);
    }

    /// No ack (crash) or a requeue (busy): the broker delivers it again later.
    fn redeliver(self: &Arc<Self>, d: Delivery) {
        let broker = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(broker.redeliver_after).await;
            let again = Delivery {
                number: d.number + 1,
                ..d
            };
            broker.queue.lock().expect("lock").push_back(again);
        });
    }
}

/// Where a simulated crash happens, relative to recording the message as processed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Crash {
    None,
    BeforeRecord,
    AfterRecord,
}

fn crash_for(cfg: &SimConfig, d: &Delivery) -> Crash {
    let seed = cfg.seed ^ (d.message << 20) ^ (u64::from(d.copy) << 16) ^ u64::from(d.number);
    let mut rng = Rng::new(seed);
    if !rng.chance(cfg.crash_rate) {
        Crash::None
    } else if rng.chance(0.5) {
        Crash::BeforeRecord
    } else {
        Crash::AfterRecord
    }
}

/// The two consumers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consumer {
    /// `if !processed.contains(id) { charge(); processed.insert(id) }`
    Naive,
    /// claim / charge with the lease's idempotency key / commit, on a `DedupStore`.
    Dedup,
}

struct Counters {
    suppressed: AtomicU64,
    crashes: AtomicU64,
}

/// Run `consumer` over the delivery stream of `cfg`. `store` is used by the dedup
/// consumer (the naive one keeps its "processed" set in memory); `consumer_name` scopes
/// its keys. `progress` is called after every acknowledged copy.
pub async fn run(
    cfg: &SimConfig,
    consumer: Consumer,
    store: Arc<dyn DedupStore>,
    consumer_name: &str,
    progress: Arc<dyn Fn() + Send + Sync>,
) -> dedup_core::Result<SimReport> {
    let started = Instant::now();
    let broker = Broker::publish(cfg);
    let provider = Arc::new(PaymentProvider::default());
    let processed = Arc::new(Mutex::new(HashSet::new()));
    let counters = Arc::new(Counters {
        suppressed: AtomicU64::new(0),
        crashes: AtomicU64::new(0),
    });
    let mut workers = Vec::new();
    for _ in 0..cfg.workers.max(1) {
        let (cfg, broker, provider, processed, counters, store, progress) = (
            cfg.clone(),
            Arc::clone(&broker),
            Arc::clone(&provider),
            Arc::clone(&processed),
            Arc::clone(&counters),
            Arc::clone(&store),
            Arc::clone(&progress),
        );
        let consumer_name = consumer_name.to_string();
        workers.push(tokio::spawn(async move {
            while let Some(d) = broker.next().await {
                let crash = crash_for(&cfg, &d);
                let acked = match consumer {
                    Consumer::Naive => {
                        naive(&cfg, d, crash, &provider, &processed, &counters).await
                    }
                    Consumer::Dedup => {
                        let key =
                            Key::new(consumer_name.as_str(), format!("payment-{}", d.message))?;
                        dedup(&cfg, d, crash, &key, &*store, &provider, &counters).await?
                    }
                };
                if acked {
                    broker.ack();
                    progress();
                } else {
                    broker.redeliver(d);
                }
            }
            Ok::<(), dedup_core::Error>(())
        }));
    }
    for w in workers {
        w.await.expect("worker panicked")?;
    }
    let charges = provider.charges.lock().expect("lock");
    Ok(SimReport {
        consumer: match consumer {
            Consumer::Naive => "naive",
            Consumer::Dedup => "dedup",
        }
        .to_string(),
        messages: cfg.messages as u64,
        deliveries: broker.deliveries.load(Ordering::SeqCst),
        duplicates_suppressed: counters.suppressed.load(Ordering::SeqCst),
        crashes: counters.crashes.load(Ordering::SeqCst),
        side_effects: charges.values().sum(),
        doubled: charges.values().filter(|&&n| n > 1).count() as u64,
        lost: (0..cfg.messages as u64)
            .filter(|m| !charges.contains_key(m))
            .count() as u64,
        time_ms: started.elapsed().as_millis() as u64,
    })
}

/// Returns whether the delivery was acknowledged.
async fn naive(
    cfg: &SimConfig,
    d: Delivery,
    crash: Crash,
    provider: &PaymentProvider,
    processed: &Mutex<HashSet<u64>>,
    counters: &Counters,
) -> bool {
    if processed.lock().expect("lock").contains(&d.message) {
        counters.suppressed.fetch_add(1, Ordering::Relaxed);
        return true;
    }
    provider.charge(cfg.payment_latency, d.message, None).await;
    if crash == Crash::BeforeRecord {
        counters.crashes.fetch_add(1, Ordering::Relaxed);
        return false;
    }
    processed.lock().expect("lock").insert(d.message);
    if crash == Crash::AfterRecord {
        counters.crashes.fetch_add(1, Ordering::Relaxed);
        return false;
    }
    true
}

/// Returns whether the delivery was acknowledged.
async fn dedup(
    cfg: &SimConfig,
    d: Delivery,
    crash: Crash,
    key: &Key,
    store: &dyn DedupStore,
    provider: &PaymentProvider,
    counters: &Counters,
) -> dedup_core::Result<bool> {
    let lease = match store.claim(key, &ClaimOptions::lease(cfg.lease)).await? {
        Claim::Acquired(lease) => lease,
        Claim::Completed { .. } => {
            counters.suppressed.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
        Claim::InFlight { .. } => {
            counters.suppressed.fetch_add(1, Ordering::Relaxed);
            return Ok(false); // another worker has it: requeue
        }
    };
    provider
        .charge(
            cfg.payment_latency,
            d.message,
            Some(lease.idempotency_key()),
        )
        .await;
    if crash == Crash::BeforeRecord {
        // The process dies: no commit, no release. The lease expires; a redelivery takes
        // the key over and charges again with the same idempotency key.
        counters.crashes.fetch_add(1, Ordering::Relaxed);
        return Ok(false);
    }
    store.commit(&lease, Some(b"charged")).await?;
    if crash == Crash::AfterRecord {
        counters.crashes.fetch_add(1, Ordering::Relaxed);
        return Ok(false);
    }
    Ok(true)
}
