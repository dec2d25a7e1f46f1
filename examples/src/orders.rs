//! The order consumer the broker programs share: each order charged once under an
//! [`Inbox`], and a [`Tally`] of what each consumer was given and answered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dedup_brokers::{ConsumerConfig, Delivery, Handle, Shutdown, shutdown, with_inbox};
use dedup_core::{BoxError, DedupStore, Handled, Inbox, InboxConfig, InboxError, Key};

use crate::report::print_table;

/// The five orders every broker program publishes.
pub const ORDERS: [&str; 5] = ["order-1", "order-2", "order-3", "order-4", "order-5"];

/// What it publishes: the orders, order-2 twice (a publisher retry: one message id).
pub const SENT: [&str; 6] = [
    "order-1", "order-2", "order-2", "order-3", "order-4", "order-5",
];

/// Where the payment provider records a charge.
pub trait Ledger: Send + Sync + 'static {
    /// Record one charge of `order`.
    fn charge(&self, order: &str) -> Result<(), BoxError>;
}

/// Charges kept in memory: order id -> how many times it was charged.
pub type Charges = Arc<Mutex<HashMap<String, u32>>>;

impl Ledger for Charges {
    fn charge(&self, order: &str) -> Result<(), BoxError> {
        *lock(self).entry(order.to_owned()).or_default() += 1;
        Ok(())
    }
}

/// What one consumer was given and answered.
#[derive(serde::Serialize, serde::Deserialize, Default, Clone, Debug)]
pub struct Tally {
    /// The consumer's name in the table.
    pub consumer: String,
    /// Deliveries it was given.
    pub deliveries: u32,
    /// Of those, the broker's redeliveries (requeued or reclaimed).
    pub redelivered: u32,
    /// Deliveries its handler processed.
    pub processed: u32,
    /// Deliveries answered as duplicates, not charged.
    pub duplicates: u32,
    /// The message ids it was given, in order.
    pub seen: Vec<String>,
    /// When it was last given a delivery.
    #[serde(skip)]
    pub last: Option<Instant>,
}

impl Tally {
    /// An empty tally of consumer `name`, to share with [`counting`].
    pub fn shared(name: &str) -> Arc<Mutex<Tally>> {
        Arc::new(Mutex::new(Tally {
            consumer: name.into(),
            ..Tally::default()
        }))
    }

    /// Whether it was given message `id`.
    pub fn has_seen(&self, id: &str) -> bool {
        self.seen.iter().any(|s| s == id)
    }

    /// Its row in [`print_tallies`].
    fn row(&self) -> Vec<String> {
        let n = [self.deliveries, self.redelivered];
        let m = [self.processed, self.duplicates];
        std::iter::once(self.consumer.clone())
            .chain(n.iter().chain(&m).map(u32::to_string))
            .collect()
    }
}

/// The tally out of its mutex.
pub fn take(tally: &Mutex<Tally>) -> Tally {
    std::mem::take(&mut *lock(tally))
}

/// Lock `m`, also after a panic elsewhere.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Charge each order once: the charge under the inbox (lease mode), keys from the
/// delivery's message id.
pub fn charging(store: Arc<dyn DedupStore>, ledger: Arc<dyn Ledger>) -> Arc<dyn Handle> {
    let config = InboxConfig {
        lease: Duration::from_secs(10),
        ..InboxConfig::default()
    };
    let inbox = Inbox::from_arc(store, config);
    Arc::new(with_inbox(inbox, move |_lease, delivery: Delivery| {
        let ledger = Arc::clone(&ledger);
        async move {
            ledger.charge(&delivery.message_id.unwrap_or_default())?;
            Ok::<_, BoxError>(Some(b"charged".to_vec()))
        }
    }))
}

/// The consumer config of the programs: keys under the consumer name `billing`,
/// `in_flight` deliveries at most.
pub fn config(in_flight: usize) -> ConsumerConfig {
    ConsumerConfig {
        consumer: Some("billing".into()),
        in_flight,
        ..ConsumerConfig::default()
    }
}

/// The handler of a consumer: [`charging`] into `ledger`, [`counting`] into `tally`.
pub fn billing(
    store: Arc<dyn DedupStore>,
    ledger: Arc<dyn Ledger>,
    tally: &Arc<Mutex<Tally>>,
) -> Arc<dyn Handle> {
    counting(charging(store, ledger), Arc::clone(tally))
}

/// `inner`, counting into `tally` what it was given and answered.
pub fn counting(inner: Arc<dyn Handle>, tally: Arc<Mutex<Tally>>) -> Arc<dyn Handle> {
    Arc::new(move |key: Key, delivery: Delivery| {
        let (inner, tally) = (Arc::clone(&inner), Arc::clone(&tally));
        async move {
            let handled = inner.handle(&key, &delivery).await;
            let mut t = lock(&tally);
            t.deliveries += 1;
            t.redelivered += u32::from(delivery.redelivered);
            t.seen.push(delivery.message_id.clone().unwrap_or_default());
            t.last = Some(Instant::now());
            match &handled {
                Ok(Handled::Processed { .. }) => t.processed += 1,
                Ok(Handled::Duplicate { .. }) => t.duplicates += 1,
                _ => {}
            }
            handled
        }
    })
}

/// Print one row per consumer.
pub fn print_tallies(tallies: &[&Tally]) {
    let headers = [
        "consumer",
        "deliveries",
        "redelivered",
        "processed",
        "duplicates",
    ];
    let rows: Vec<Vec<String>> = tallies.iter().map(|t| t.row()).collect();
    print_table(&headers, &rows);
}

/// The charges against [`ORDERS`]: in all, orders charged more than once, orders never
/// charged.
pub fn count(charges: &HashMap<String, u32>) -> (u32, usize, usize) {
    let total = charges.values().sum();
    let doubled = charges.values().filter(|n| **n > 1).count();
    let lost = ORDERS.iter().filter(|o| !charges.contains_key(**o)).count();
    (total, doubled, lost)
}

/// A shutdown signal raised once `tally` shows `done`, or after `limit`.
pub fn stop_when(
    tally: &Arc<Mutex<Tally>>,
    limit: Duration,
    done: impl Fn(&Tally) -> bool + Send + 'static,
) -> Shutdown {
    let (stop, stopped) = shutdown();
    let (tally, started) = (Arc::clone(tally), Instant::now());
    tokio::spawn(async move {
        while !done(&lock(&tally)) && started.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.shut_down();
    });
    stopped
}

/// `inner`, except that after handling `order` (any order: `None`) it never answers: the
/// consumer is as good as dead before it acknowledges.
pub fn dying_after(inner: Arc<dyn Handle>, order: Option<&'static str>) -> Arc<dyn Handle> {
    Arc::new(move |key: Key, delivery: Delivery| {
        let inner = Arc::clone(&inner);
        async move {
            let handled = inner.handle(&key, &delivery).await;
            if order.is_none_or(|o| delivery.message_id.as_deref() == Some(o)) {
                return std::future::pending::<Result<Handled, InboxError>>().await;
            }
            handled
        }
    })
}
