//! What a run reports: [`Report`] for a passing run, [`Failure`] for a broken guarantee.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::check::Violation;
use crate::schedule::Schedule;
use crate::seed::SEED_ENV;

/// What a passing run did.
#[derive(Clone, Debug)]
pub struct Report {
    /// Cases asked for.
    pub cases: u32,
    /// Cases run.
    pub runs: u64,
    /// The seed (hex), to run the same cases again with [`Kit::seed`](crate::Kit::seed).
    pub seed: String,
    /// Wall-clock time of the whole run, setup included.
    pub elapsed: Duration,
    /// Kills over all cases, by where the worker stood (`before the commit`, ...): which
    /// windows the run explored.
    pub kills: BTreeMap<String, usize>,
    /// Injected failures over all cases, by the operation that failed.
    pub failures: BTreeMap<String, usize>,
    /// Lease mode: repeated effects the mode excused over all cases (each made by a run
    /// interrupted between the effect and its commit). Transactional mode: always 0.
    pub excused_repeats: usize,
    /// Messages over all cases whose payload was poison ([`Kit::poison`](crate::Kit::poison)):
    /// how much of the run tested the consumer's poison handling.
    pub poison_messages: u64,
}

/// A broken guarantee: the smallest schedule proptest shrank the failure to, what it
/// broke, and its story.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The seed of the run (hex): [`Kit::seed`](crate::Kit::seed) or [`SEED_ENV`] replays it.
    pub seed: String,
    /// The mode checked.
    pub mode: crate::Mode,
    /// The smallest failing schedule.
    pub schedule: Schedule,
    /// Each message's payload in that schedule ([`Kit::payloads`](crate::Kit::payloads));
    /// empty without a generator.
    pub payloads: Vec<Vec<u8>>,
    /// Whether each message's payload is poison ([`Kit::poison`](crate::Kit::poison)).
    pub poison: Vec<bool>,
    /// What it broke (empty if the rerun for the story did not fail again: see
    /// [`reproduced`](Self::reproduced)).
    pub violations: Vec<Violation>,
    /// The failure as proptest recorded it.
    pub reason: String,
    /// The smallest schedule, as it ran: deliveries, stopping points passed, kills,
    /// expiries, effects, commits, acks.
    pub story: Vec<String>,
    /// Whether running the smallest schedule again failed again (it should: a consumer
    /// that only waits at the kit's stopping points runs the same way every time).
    pub reproduced: bool,
    /// Wall-clock time until the failure was shrunk.
    pub elapsed: Duration,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.mode {
            crate::Mode::Lease => "lease mode",
            crate::Mode::Tx => "transactional mode",
        };
        writeln!(f, "dedup-testkit: the consumer broke a guarantee ({mode})")?;
        if self.violations.is_empty() {
            writeln!(f, "  {}", self.reason)?;
            writeln!(
                f,
                "  (running the smallest schedule again did not fail: the consumer does not run the same way twice)"
            )?;
        }
        for v in &self.violations {
            writeln!(f, "  {v}")?;
        }
        writeln!(f, "smallest schedule: {}", self.schedule)?;
        for (i, payload) in self.payloads.iter().enumerate() {
            let poison = if self.poison.get(i) == Some(&true) {
                " (poison)"
            } else {
                ""
            };
            writeln!(f, "  m{i}'s payload: {}{poison}", shown(payload))?;
        }
        writeln!(f, "what happened:")?;
        for (i, line) in self.story.iter().enumerate() {
            writeln!(f, "  {:>3}. {line}", i + 1)?;
        }
        write!(
            f,
            "replay: Kit::new().seed(\"{seed}\")? or {SEED_ENV}={seed}",
            seed = self.seed
        )
    }
}

impl std::error::Error for Failure {}

/// The most bytes of a payload a failure prints.
const SHOWN_BYTES: usize = 64;

/// `payload` as a byte string literal (`b"..."`, escaped), cut after [`SHOWN_BYTES`].
fn shown(payload: &[u8]) -> String {
    let cut = payload.len().min(SHOWN_BYTES);
    let more = if cut < payload.len() {
        format!("... ({} bytes)", payload.len())
    } else {
        String::new()
    };
    format!("b\"{}\"{more}", payload[..cut].escape_ascii())
}
