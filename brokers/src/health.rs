//! [`Health`]: a consumer's live state for liveness and readiness probes.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// A cloneable view of a running consumer, for probes: take it with the consumer's
/// `health()` before `run`, and read [`snapshot`](Self::snapshot) from anywhere while it
/// runs. Every clone sees the same consumer.
#[derive(Clone, Debug, Default)]
pub struct Health(Arc<State>);

#[derive(Debug, Default)]
struct State {
    connected: AtomicBool,
    in_flight: AtomicUsize,
    reconnects: AtomicU64,
    last_settle: Mutex<Option<SystemTime>>,
}

/// What [`Health::snapshot`] reads at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthSnapshot {
    /// Whether the consumer holds a live connection to the broker: false before the first
    /// connect, while it reconnects after a lost connection, and after `run` returned.
    /// A readiness probe fails while this is false.
    pub connected: bool,
    /// Deliveries started and not yet settled (handlers running or settling).
    pub in_flight: usize,
    /// When a delivery was last settled with the broker (ack, retry or dead-letter), if
    /// ever. A liveness probe may compare it with the traffic it expects.
    pub last_settle: Option<SystemTime>,
    /// Times the connection was lost and made again.
    pub reconnects: u64,
}

impl Health {
    /// The consumer's state now.
    pub fn snapshot(&self) -> HealthSnapshot {
        HealthSnapshot {
            connected: self.0.connected.load(Ordering::Relaxed),
            in_flight: self.0.in_flight.load(Ordering::Relaxed),
            last_settle: *self.0.last_settle.lock().unwrap_or_else(|e| e.into_inner()),
            reconnects: self.0.reconnects.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn set_connected(&self, connected: bool) {
        self.0.connected.store(connected, Ordering::Relaxed);
    }

    pub(crate) fn reconnecting(&self) {
        self.set_connected(false);
        self.0.reconnects.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn started(&self) {
        self.0.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// A started delivery is done; `settled`: the broker took its action.
    pub(crate) fn finished(&self, settled: bool) {
        if settled {
            *self.0.last_settle.lock().unwrap_or_else(|e| e.into_inner()) = Some(SystemTime::now());
        }
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}
