//! [`Health`]: a consumer's live state for liveness and readiness probes.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use dedup_core::health::{Probe, ProbeReport};

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

impl Health {
    /// This consumer as a [`Probe`] named `consumer NAME`, for
    /// [`HealthChecks`](dedup_core::health::HealthChecks) and the console's `/readyz`.
    ///
    /// Ready while connected. Not live while deliveries are in flight and none was
    /// settled for five minutes (a stuck handler); change it with
    /// [`ConsumerProbe::stall_after`].
    pub fn probe(&self, name: &str) -> ConsumerProbe {
        ConsumerProbe {
            name: format!("consumer {name}"),
            health: self.clone(),
            stall_after: Duration::from_secs(300),
        }
    }
}

/// A consumer's [`Health`] as a [`Probe`] (see [`Health::probe`]).
#[derive(Clone, Debug)]
pub struct ConsumerProbe {
    name: String,
    health: Health,
    stall_after: Duration,
}

impl ConsumerProbe {
    /// The same probe, not live once deliveries are in flight and none was settled for
    /// `after`. Set it above the longest handler run.
    pub fn stall_after(mut self, after: Duration) -> Self {
        self.stall_after = after;
        self
    }
}

#[async_trait::async_trait]
impl Probe for ConsumerProbe {
    fn name(&self) -> &str {
        &self.name
    }

    async fn probe(&self) -> ProbeReport {
        let s = self.health.snapshot();
        let mut report = ProbeReport::ok(self.name.clone());
        report.connected = Some(s.connected);
        report.in_flight = Some(s.in_flight as u64);
        report.last_activity = s.last_settle;
        let stalled = s.in_flight > 0
            && s.last_settle.is_some_and(|t| {
                SystemTime::now()
                    .duration_since(t)
                    .is_ok_and(|d| d > self.stall_after)
            });
        if stalled {
            report.not_live("no settle while in flight")
        } else if !s.connected {
            report.not_ready("not connected")
        } else {
            report
        }
    }
}
