//! [`RelayHealth`]: a relay's live state for liveness and readiness probes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::health::{Probe, ProbeReport};

/// A cloneable view of a running [`Relay`](super::Relay), for probes.
///
/// Take it with [`Relay::health`](super::Relay::health) before
/// [`start`](super::Relay::start). Read [`snapshot`](Self::snapshot) from anywhere while
/// it runs. Every clone sees the same relay. It is a [`Probe`] named `relay`: ready while
/// the relay runs, its last take answered and its last publish did not fail as a whole;
/// live unless its rounds stopped turning for [`stall_after`](Self::stall_after).
#[derive(Clone, Debug)]
pub struct RelayHealth(Arc<State>);

#[derive(Debug)]
struct State {
    running: AtomicBool,
    store_ok: AtomicBool,
    publisher_ok: AtomicBool,
    pending: AtomicU64,
    oldest_unsent_ms: AtomicU64,
    stats_read: AtomicBool,
    last_round: Mutex<Option<SystemTime>>,
    last_publish: Mutex<Option<SystemTime>>,
    stall_after: Mutex<Duration>,
}

impl Default for RelayHealth {
    fn default() -> Self {
        RelayHealth(Arc::new(State {
            running: AtomicBool::new(false),
            store_ok: AtomicBool::new(true),
            publisher_ok: AtomicBool::new(true),
            pending: AtomicU64::new(0),
            oldest_unsent_ms: AtomicU64::new(0),
            stats_read: AtomicBool::new(false),
            last_round: Mutex::new(None),
            last_publish: Mutex::new(None),
            stall_after: Mutex::new(Duration::from_secs(300)),
        }))
    }
}

/// What [`RelayHealth::snapshot`] reads at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayHealthSnapshot {
    /// Between [`Relay::start`](super::Relay::start) and its stop.
    pub running: bool,
    /// Whether the relay's last take from the store answered.
    pub store_ok: bool,
    /// Whether the last round that published rows had at least one accepted by the
    /// broker. The publisher keeps no connection state of its own, so this stands for
    /// "broker connected".
    pub publisher_ok: bool,
    /// Rows pending or held, as of the relay's last stats read
    /// ([`RelayConfig::stats_interval`](super::RelayConfig::stats_interval); `None`
    /// before the first).
    pub pending: Option<u64>,
    /// How long the oldest unsent row had waited at that read.
    pub oldest_unsent: Option<Duration>,
    /// When a round last ended (rows or none).
    pub last_round: Option<SystemTime>,
    /// When a row was last published and marked sent.
    pub last_publish: Option<SystemTime>,
}

fn lock<T: Copy>(m: &Mutex<T>) -> T {
    *m.lock().unwrap_or_else(|e| e.into_inner())
}

fn set<T>(m: &Mutex<T>, value: T) {
    *m.lock().unwrap_or_else(|e| e.into_inner()) = value;
}

impl RelayHealth {
    /// The relay's state now.
    pub fn snapshot(&self) -> RelayHealthSnapshot {
        let s = &self.0;
        let stats = s.stats_read.load(Ordering::Relaxed);
        RelayHealthSnapshot {
            running: s.running.load(Ordering::Relaxed),
            store_ok: s.store_ok.load(Ordering::Relaxed),
            publisher_ok: s.publisher_ok.load(Ordering::Relaxed),
            pending: stats.then(|| s.pending.load(Ordering::Relaxed)),
            oldest_unsent: stats
                .then(|| Duration::from_millis(s.oldest_unsent_ms.load(Ordering::Relaxed))),
            last_round: lock(&s.last_round),
            last_publish: lock(&s.last_publish),
        }
    }

    /// How long the rounds may stop turning before the probe says the relay is not live
    /// (default 5 min). Set it above the poll interval plus the longest publish.
    pub fn stall_after(&self, after: Duration) -> &Self {
        set(&self.0.stall_after, after);
        self
    }

    pub(super) fn set_running(&self, running: bool) {
        self.0.running.store(running, Ordering::Relaxed);
        if running {
            set(&self.0.last_round, Some(SystemTime::now()));
        }
    }

    pub(super) fn took(&self, ok: bool) {
        self.0.store_ok.store(ok, Ordering::Relaxed);
        set(&self.0.last_round, Some(SystemTime::now()));
    }

    /// A publish of `rows` rows answered, `accepted` of them accepted.
    pub(super) fn published(&self, rows: usize, accepted: usize) {
        if rows == 0 {
            return;
        }
        self.0.publisher_ok.store(accepted > 0, Ordering::Relaxed);
        if accepted > 0 {
            set(&self.0.last_publish, Some(SystemTime::now()));
        }
    }

    pub(super) fn stats(&self, pending: u64, oldest_unsent: Duration) {
        self.0.pending.store(pending, Ordering::Relaxed);
        let ms = u64::try_from(oldest_unsent.as_millis()).unwrap_or(u64::MAX);
        self.0.oldest_unsent_ms.store(ms, Ordering::Relaxed);
        self.0.stats_read.store(true, Ordering::Relaxed);
    }
}

#[async_trait]
impl Probe for RelayHealth {
    fn name(&self) -> &str {
        "relay"
    }

    async fn probe(&self) -> ProbeReport {
        let s = self.snapshot();
        let mut report = ProbeReport::ok("relay");
        report.connected = Some(s.publisher_ok);
        report.in_flight = s.pending;
        report.last_activity = s.last_publish;
        let stalled = s.last_round.is_some_and(|t| {
            SystemTime::now()
                .duration_since(t)
                .is_ok_and(|d| d > lock(&self.0.stall_after))
        });
        if !s.running {
            report.not_ready("not running")
        } else if stalled {
            report.not_live("rounds stalled")
        } else if !s.store_ok {
            report.not_ready("store unreachable")
        } else if !s.publisher_ok {
            report.not_ready("publish failing")
        } else {
            report
        }
    }
}
