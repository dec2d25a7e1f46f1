//! The chaos harness behind the `chaos` program (`src/main.rs`): worker OS processes consume an
//! at-least-once queue while a controller SIGKILLs them at chosen points, and crash-restarts
//! the servers under them; afterwards every message's effects are counted.
//!
//! - The stream is a queue table in a PostgreSQL private to the run ([`queue`]) with a
//!   visibility timeout: a received message not acknowledged in time is delivered again,
//!   to any worker. That server is the harness's own, whichever store is under test.
//! - Each worker ([`worker`]) processes a message in four steps, and before each one
//!   announces the window it is in on stdout and waits for the controller's go-ahead on
//!   stdin: `before_claim`, `claim_effect` (claimed, effect not yet done),
//!   `effect_commit` (effect done, not committed) and `commit_ack` (committed, not
//!   acknowledged). The controller ([`controller`]) answers "go" or SIGKILLs the worker
//!   right there, so every kill lands in a known window for a known message, and starts a
//!   replacement. The first announcement of each window is always killed, so every window
//!   is covered; after that each announcement is killed with the configured probability.
//! - The store is picked by backend name from the registry (`dedup::url::backends()`);
//!   what is truly per backend lives in its module under [`backends`], chosen by the
//!   store URL's descriptor: the store a run uses (a file, the queue's PostgreSQL, or a
//!   private server of its own) and how to crash it, and the transactional handler.
//! - Lease mode (every backend with a chaos module): the workers open the store's URL with
//!   `dedup::open`, claim, append the effect to a file and `fsync` it (an external side
//!   effect the store cannot roll back), commit, acknowledge. Transactional mode (a
//!   backend whose module has a handler: the SQL ones): claim inside a database
//!   transaction through the backend's `TxInbox`, insert the effect row in the same
//!   transaction, commit it, acknowledge.
//! - Restarts: the queue's PostgreSQL is crash-restarted (`pg_ctl -m immediate`) once when
//!   a third of the messages are acknowledged; a store server of its own (a backend
//!   module's [`Restart`](backends::Restart)) is crashed and restarted once at two thirds.
//!
//! - Failover runs (`--failover`, [`RunConfig::failover`]): the store on a primary with a
//!   standby (a backend module's [`failover`](backends::ChaosBackend::failover)), reached
//!   through a [`proxy::SwitchingProxy`]; at half the messages the primary is SIGKILLed,
//!   the standby promoted and the front switched; afterwards every key is read on the
//!   promoted node ([`Figures::completions_lost`]). The partition scenario is
//!   [`partition`], on a host of its own made by [`netns`]; the Redis Cluster one
//!   (a primary cut off in a minority) is `cluster_partition`; the delayed link one
//!   (renewals arriving late) is [`slow_link`].
//!
//! Checks ([`Figures::violations`]): transactional mode, every message has exactly one
//! effect; lease mode, every message has at least one effect, and each message's extra
//! effects are no more than the kills that hit that message in the `effect_commit` window
//! (the only place the contract allows a repeat: the effect happened, the commit did not).

pub mod backends;
#[cfg(feature = "redis")]
pub mod cluster_partition;
#[cfg(feature = "redis")]
pub mod cluster_worker;
pub mod controller;
pub mod netns;
pub mod partition;
pub mod protocol;
pub mod proxy;
pub mod queue;
#[cfg(feature = "redis")]
pub mod redis_cluster;
#[cfg(feature = "redis")]
pub mod redis_sentinel;
#[cfg(feature = "redis")]
pub mod redis_server;
pub mod slow_link;
pub mod worker;

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

pub use controller::{RunConfig, run};

/// How workers make their effect permanent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Claim a lease, do the effect outside the store, commit.
    Lease,
    /// Claim and write the effect in one database transaction (SQL backends).
    Transactional,
}

/// How a failover run's standby is kept up to date (`--failover`): what a commit
/// acknowledged by the primary has reached when the primary dies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Replication {
    /// Asynchronous: the primary acknowledges a commit once its own log has it.
    Async,
    /// Synchronous: PostgreSQL `synchronous_standby_names` naming the standby and
    /// `synchronous_commit = on` (the standby has flushed the WAL); Redis `WAIT 1` after
    /// each commit; MariaDB semi-synchronous, `AFTER_SYNC` (the replica has the events).
    Sync,
    /// The same with `synchronous_commit = remote_apply`: once the standby has applied it.
    RemoteApply,
}

impl Replication {
    /// Whether an acknowledged commit is on the standby when the primary dies.
    pub fn synchronous(self) -> bool {
        self != Replication::Async
    }
}

/// Where a worker can be killed while processing one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Window {
    /// Received, not claimed yet.
    BeforeClaim,
    /// Claimed, effect not done.
    ClaimEffect,
    /// Effect done, not committed.
    EffectCommit,
    /// Committed, not acknowledged.
    CommitAck,
}

impl Window {
    /// Every window, in processing order.
    pub const ALL: [Window; 4] = [
        Window::BeforeClaim,
        Window::ClaimEffect,
        Window::EffectCommit,
        Window::CommitAck,
    ];

    /// The name used in the announcement protocol and the report.
    pub fn name(self) -> &'static str {
        match self {
            Window::BeforeClaim => "before_claim",
            Window::ClaimEffect => "claim_effect",
            Window::EffectCommit => "effect_commit",
            Window::CommitAck => "commit_ack",
        }
    }

    /// The window named `name`.
    pub fn parse(name: &str) -> Option<Window> {
        Window::ALL.into_iter().find(|w| w.name() == name)
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Figures {
    /// Which store: its backend's name in the registry.
    pub backend: Option<&'static str>,
    /// Which mode.
    pub mode: Option<Mode>,
    /// Whether the workers skipped the store (a demonstration that the checks fail).
    pub without_dedup: bool,
    /// Messages enqueued (each once).
    pub messages: u64,
    /// Deliveries made by the queue (redeliveries included).
    pub deliveries: u64,
    /// Kills by window.
    pub kills: BTreeMap<&'static str, u64>,
    /// Server restarts made mid-run (`postgres`: the queue's, and the store's own server
    /// by the name its chaos module gives it).
    pub restarts: BTreeMap<&'static str, u64>,
    /// Effects recorded.
    pub effects: u64,
    /// Messages with more than one effect.
    pub doubled: u64,
    /// Messages with no effect.
    pub lost: u64,
    /// Commits that answered `LeaseLost`: a worker outlived its lease (a step took longer
    /// than the lease, e.g. during a server restart) and another took the message over.
    /// Its effect can then repeat without a kill, which the checks count as a violation;
    /// the runs use leases far longer than a step so that this does not happen.
    pub lease_lost: u64,
    /// Doubled messages whose extra effects are all matched by kills in the
    /// `effect_commit` window of the same message.
    pub doubled_paired: u64,
    /// Failover runs: how the standby was replicated.
    pub replication: Option<Replication>,
    /// Failover runs: messages acknowledged to the queue whose key the promoted standby
    /// does not hold as completed (a redelivery would run them again).
    pub completions_lost: Option<u64>,
    /// Wall time of the run, in seconds.
    pub seconds: f64,
}

impl Figures {
    /// The checks this run failed (empty: it passed). See the module docs. A failover run
    /// with asynchronous replication is measured, not checked: losing the last commits is
    /// what such a standby allows. A synchronous one must also keep every completion.
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.replication == Some(Replication::Async) {
            return out;
        }
        if let Some(n) = self.completions_lost.filter(|n| *n > 0) {
            out.push(format!(
                "{n} completions missing on the promoted standby ({:?} replication)",
                self.replication
            ));
        }
        if self.lost > 0 {
            out.push(format!("{} messages lost (no effect)", self.lost));
        }
        match self.mode {
            Some(Mode::Transactional) if self.doubled > 0 => out.push(format!(
                "{} messages doubled in transactional mode",
                self.doubled
            )),
            _ if self.doubled > self.doubled_paired => out.push(format!(
                "{} doubled messages not accounted for by a kill between effect and commit                  ({} commits found their lease expired and taken over)",
                self.doubled - self.doubled_paired,
                self.lease_lost
            )),
            _ => {}
        }
        out
    }
}
