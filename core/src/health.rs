//! Liveness and readiness: what a Kubernetes probe, or the application's own health
//! route, asks of the store, the consumers and the relay.
//!
//! Each part that can fail is a [`Probe`]: the store ([`StoreProbe`]), each consumer
//! (`dedup_brokers::Health::probe`), the relay ([`RelayHealth`](crate::outbox::RelayHealth)).
//! [`HealthChecks`] holds them and answers one [`HealthReport`]: ready when every probe
//! is ready, live when every probe is live.
//!
//! Liveness fails only when a restart can help: a handler stuck for long, a relay whose
//! rounds stopped. Readiness fails when a dependency is away: the store unreachable, a
//! consumer reconnecting, the relay's publishes failing. A report holds names, flags,
//! counts and times: never a URL, a key or an error's text.
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use dedup_core::MemoryStore;
//! use dedup_core::health::HealthChecks;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let checks = HealthChecks::new().with_store("store", Arc::new(MemoryStore::new()));
//! let report = checks.report().await;
//! assert!(report.ready && report.live);
//! assert_eq!(report.probes[0].name, "store");
//! # }
//! ```

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::{Admin, Key, error_chain};

/// How long [`HealthChecks`] waits for one probe by default.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What one probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProbeReport {
    /// The probe's name (`store`, `consumer orders`, `relay`).
    pub name: String,
    /// Whether the part can take work now.
    pub ready: bool,
    /// Whether the part still makes progress (false: a restart may help).
    pub live: bool,
    /// Why it is not ready or not live, in a few words (`unreachable`, `reconnecting`),
    /// or `ok`. Never an error's text.
    pub detail: &'static str,
    /// Whether it holds its connection (consumers, the relay's publisher).
    pub connected: Option<bool>,
    /// Messages in flight now (consumers), or outbox rows waiting (the relay).
    pub in_flight: Option<u64>,
    /// When it last settled a message or published a row.
    pub last_activity: Option<SystemTime>,
}

impl ProbeReport {
    /// A report named `name`, ready and live, with no figures.
    pub fn ok(name: impl Into<String>) -> Self {
        ProbeReport {
            name: name.into(),
            ready: true,
            live: true,
            detail: "ok",
            connected: None,
            in_flight: None,
            last_activity: None,
        }
    }

    /// The same report, not ready, because of `detail`.
    pub fn not_ready(mut self, detail: &'static str) -> Self {
        self.ready = false;
        self.detail = detail;
        self
    }

    /// The same report, neither live nor ready, because of `detail`.
    pub fn not_live(mut self, detail: &'static str) -> Self {
        self.live = false;
        self.ready = false;
        self.detail = detail;
        self
    }
}

/// One part whose health can be asked.
///
/// Implemented by [`StoreProbe`], the relay's [`RelayHealth`](crate::outbox::RelayHealth)
/// and the consumers' probes in `dedup-brokers`. A probe answers quickly.
/// [`HealthChecks`] bounds each call by its timeout all the same.
#[async_trait]
pub trait Probe: Send + Sync + std::fmt::Debug {
    /// The name its report carries.
    fn name(&self) -> &str;

    /// The part's state now.
    async fn probe(&self) -> ProbeReport;
}

/// The store is reachable: a read of one key answers within the timeout.
///
/// It reads the record of a key no consumer uses (`dedup-health` / `probe`) and writes
/// nothing.
#[derive(Clone)]
pub struct StoreProbe {
    name: String,
    admin: Arc<dyn Admin>,
}

impl std::fmt::Debug for StoreProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreProbe")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl StoreProbe {
    /// A probe of `admin`, reported as `name`.
    pub fn new(name: impl Into<String>, admin: Arc<dyn Admin>) -> Self {
        StoreProbe {
            name: name.into(),
            admin,
        }
    }
}

#[async_trait]
impl Probe for StoreProbe {
    fn name(&self) -> &str {
        &self.name
    }

    async fn probe(&self) -> ProbeReport {
        let report = ProbeReport::ok(self.name.clone());
        let key = match Key::new("dedup-health", "probe") {
            Ok(key) => key,
            Err(_) => return report.not_ready("bad probe key"),
        };
        match self.admin.get(&key).await {
            Ok(_) => report,
            Err(e) => {
                tracing::debug!(probe = %self.name, error = %error_chain(&e), "dedup health: the store did not answer");
                report.not_ready("unreachable")
            }
        }
    }
}

/// All of an application's probes at once.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct HealthReport {
    /// Every probe is ready: serve readiness with 200, else 503.
    pub ready: bool,
    /// Every probe is live: serve liveness with 200, else 503.
    pub live: bool,
    /// Each probe's report, in the order they were added.
    pub probes: Vec<ProbeReport>,
}

/// The probes an application serves as its health: a cheap clone shares them.
#[derive(Clone, Debug)]
pub struct HealthChecks {
    probes: Vec<Arc<dyn Probe>>,
    timeout: Duration,
}

impl Default for HealthChecks {
    fn default() -> Self {
        HealthChecks::new()
    }
}

impl HealthChecks {
    /// No probe yet: ready and live. Each probe gets [`DEFAULT_PROBE_TIMEOUT`].
    pub fn new() -> Self {
        HealthChecks {
            probes: Vec::new(),
            timeout: DEFAULT_PROBE_TIMEOUT,
        }
    }

    /// The same checks with `probe` too.
    pub fn with(mut self, probe: impl Probe + 'static) -> Self {
        self.probes.push(Arc::new(probe));
        self
    }

    /// The same checks with a [`StoreProbe`] of `admin`, named `name`.
    pub fn with_store(self, name: impl Into<String>, admin: Arc<dyn Admin>) -> Self {
        self.with(StoreProbe::new(name, admin))
    }

    /// The same checks giving each probe `timeout` (a probe that takes longer is not
    /// ready, and still live).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether no probe was added.
    pub fn is_empty(&self) -> bool {
        self.probes.is_empty()
    }

    /// Every probe, asked at once.
    pub async fn report(&self) -> HealthReport {
        let asks = self.probes.iter().map(|p| async move {
            match tokio::time::timeout(self.timeout, p.probe()).await {
                Ok(report) => report,
                Err(_) => ProbeReport::ok(p.name()).not_ready("timed out"),
            }
        });
        let probes = futures::future::join_all(asks).await;
        HealthReport {
            ready: probes.iter().all(|p| p.ready),
            live: probes.iter().all(|p| p.live),
            probes,
        }
    }
}
