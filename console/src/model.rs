//! What each view shows, as the JSON under `/api/...` returns it (and the HTML renders).
//! Times are milliseconds since the Unix epoch (UTC), ages and durations milliseconds.

use serde::Serialize;

pub use crate::message::{Body, Message};

/// `GET /api/overview`.
#[derive(Clone, Debug, Serialize)]
pub struct Overview {
    /// The store, its URL with any password removed.
    pub store: String,
    /// The store's clock when the counts were taken.
    pub now: i64,
    /// One line per consumer, in name order.
    pub consumers: Vec<ConsumerLine>,
    /// The live lease that expires first, store-wide.
    pub oldest_lease: Option<LeaseLine>,
    /// The outbox, when the console has one.
    pub outbox: Option<OutboxLine>,
    /// The store's last purge run, whichever process ran it (`None`: none finished yet).
    pub last_purge: Option<PurgeLine>,
    /// Where the counts came from: `kept` (counts the store keeps, `dedup counts enable`)
    /// or `scan` (every record read).
    pub counts_source: &'static str,
    /// Set when the counts came from reading every record of a large store that could
    /// keep them instead: the advice to enable kept counts.
    pub counts_hint: Option<String>,
}

/// One consumer's records by status.
#[derive(Clone, Debug, Serialize)]
pub struct ConsumerLine {
    /// The consumer.
    pub consumer: String,
    /// Processed (completed with a handler's outcome).
    pub processed: u64,
    /// In flight with a live lease.
    pub in_flight: u64,
    /// In flight, lease expired or released (the next delivery retries).
    pub expired: u64,
    /// Completed with a stored failure.
    pub failed: u64,
    /// Dead-lettered.
    pub dead_lettered: u64,
}

/// A live lease.
#[derive(Clone, Debug, Serialize)]
pub struct LeaseLine {
    /// Its consumer.
    pub consumer: String,
    /// Its message id.
    pub message_id: String,
    /// Its attempt.
    pub attempt: u32,
    /// Its fence.
    pub fence: u64,
    /// When it expires.
    pub expires_at: i64,
}

/// The outbox's rows by state: the whole table, and per destination.
#[derive(Clone, Debug, Serialize)]
pub struct OutboxLine {
    /// Waiting to be published.
    pub pending: u64,
    /// Held by a relay.
    pub held: u64,
    /// Published, not yet purged.
    pub sent: u64,
    /// Dead.
    pub dead: u64,
    /// How long the oldest unsent row has waited (the lag), in milliseconds.
    pub lag_ms: u64,
    /// The same counts per destination, in destination order (one line per destination
    /// that has rows).
    pub destinations: Vec<DestinationLine>,
}

/// One outbox destination's rows by state, and its lag.
#[derive(Clone, Debug, Serialize)]
pub struct DestinationLine {
    /// The destination.
    pub destination: String,
    /// Waiting to be published.
    pub pending: u64,
    /// Held by a relay.
    pub held: u64,
    /// Published, not yet purged.
    pub sent: u64,
    /// Dead.
    pub dead: u64,
    /// How long its oldest pending or held row has waited, in milliseconds.
    pub lag_ms: u64,
}

/// The store's last purge run (see `dedup_core::PurgeRun`).
#[derive(Clone, Debug, Serialize)]
pub struct PurgeLine {
    /// When it finished, by the store's clock.
    pub finished_at: i64,
    /// Records removed (completed and expired in-flight ones).
    pub removed: u64,
    /// How long it took, in milliseconds.
    pub took_ms: u64,
    /// Whether it stopped at its batch limit with records possibly left: cleanup did not
    /// keep up in that run.
    pub stopped_early: bool,
}

/// `GET /api/failures`: failed and dead-lettered keys grouped by kind and first line.
#[derive(Clone, Debug, Serialize)]
pub struct Failures {
    /// Records read to build the groups.
    pub scanned: usize,
    /// Whether the scan stopped at the limit (more failures exist than were grouped).
    pub truncated: bool,
    /// The groups, largest first.
    pub groups: Vec<FailureGroup>,
}

/// Keys that failed the same way.
#[derive(Clone, Debug, Serialize)]
pub struct FailureGroup {
    /// The group's id (a hash of kind and first line), for links and actions.
    pub id: String,
    /// The failure's kind (`handler`, `panic`, ...).
    pub kind: String,
    /// The first line of the outermost error message.
    pub first_line: String,
    /// Keys in the group.
    pub count: usize,
    /// Earliest failure time among them.
    pub first_seen: i64,
    /// Latest failure time among them.
    pub last_seen: i64,
    /// The keys (at most a page of them; the group page pages through all).
    pub keys: Vec<KeyLine>,
}

/// A key in a list.
#[derive(Clone, Debug, Serialize)]
pub struct KeyLine {
    /// Its consumer.
    pub consumer: String,
    /// Its message id.
    pub message_id: String,
    /// Its status (`failed`, `dead-letter`, `in-flight`, `expired`, `completed`).
    pub status: &'static str,
    /// Its attempt.
    pub attempt: u32,
    /// Its fence.
    pub fence: u64,
    /// When it failed (failures), or when its lease expires (leases).
    pub at: i64,
}

/// `GET /api/key`: one key in full, and its dead-lettered message.
#[derive(Clone, Debug, Serialize)]
pub struct KeyView {
    /// The key's record.
    #[serde(flatten)]
    pub key: KeyDetail,
    /// The dead-lettered copy, read from the broker (or why not).
    pub message: Message,
}

/// One key's record.
#[derive(Clone, Debug, Serialize)]
pub struct KeyDetail {
    /// Its consumer.
    pub consumer: String,
    /// Its message id.
    pub message_id: String,
    /// Its status.
    pub status: &'static str,
    /// Its attempt.
    pub attempt: u32,
    /// Its fence.
    pub fence: u64,
    /// When it was first claimed, where the store keeps it.
    pub first_claimed_at: Option<i64>,
    /// When its lease expires (in flight).
    pub expires_at: Option<i64>,
    /// When it was processed (completed).
    pub processed_at: Option<i64>,
    /// The size of its stored outcome, in bytes.
    pub outcome_len: Option<usize>,
    /// The stored failure: the settled cause, or the latest released one.
    pub failure: Option<FailureDetail>,
}

/// A stored failure.
#[derive(Clone, Debug, Serialize)]
pub struct FailureDetail {
    /// Its kind.
    pub kind: String,
    /// The error chain, outermost first.
    pub chain: Vec<String>,
    /// When it failed.
    pub at: i64,
    /// Which attempt.
    pub attempt: u32,
    /// The worker that ran it.
    pub worker: Option<String>,
}

/// `GET /api/stuck`.
#[derive(Clone, Debug, Serialize)]
pub struct Stuck {
    /// The threshold, in milliseconds.
    pub older_than_ms: u64,
    /// In-flight records read.
    pub scanned: usize,
    /// Whether the scan stopped at the limit.
    pub truncated: bool,
    /// The stuck leases (at most a page).
    pub leases: Vec<StuckLine>,
}

/// A stuck lease.
#[derive(Clone, Debug, Serialize)]
pub struct StuckLine {
    /// The key, its attempt, fence and expiry.
    #[serde(flatten)]
    pub key: KeyLine,
    /// When it was first claimed (where the store keeps it).
    pub first_claimed_at: Option<i64>,
    /// Why it counts as stuck: `held-too-long`, `expired`, or `in-flight` (a zero threshold).
    pub why: &'static str,
    /// The worker of its latest released failure, if any.
    pub last_worker: Option<String>,
}

/// `GET /api/outbox/dead`.
#[derive(Clone, Debug, Serialize)]
pub struct DeadRows {
    /// Dead rows read.
    pub scanned: usize,
    /// Whether the scan stopped at the limit.
    pub truncated: bool,
    /// Groups by the first line of the last error, largest first.
    pub groups: Vec<DeadGroup>,
}

/// Dead rows that failed the same way.
#[derive(Clone, Debug, Serialize)]
pub struct DeadGroup {
    /// The group's id (a hash of the first line).
    pub id: String,
    /// The first line of the last publish error.
    pub first_line: String,
    /// Rows in the group.
    pub count: usize,
    /// The rows (at most a page).
    pub rows: Vec<DeadRow>,
}

/// A dead outbox row.
#[derive(Clone, Debug, Serialize)]
pub struct DeadRow {
    /// Its id.
    pub id: i64,
    /// Its destination.
    pub destination: String,
    /// Its message id.
    pub message_id: String,
    /// Its payload's size in bytes.
    pub payload_len: usize,
    /// Its headers.
    pub headers: Vec<(String, String)>,
    /// Publish attempts.
    pub attempts: u32,
    /// When it was written.
    pub written_at: i64,
    /// Its last error in full.
    pub last_error: Option<String>,
}

/// `POST /api/act/{action}`: what the action did.
#[derive(Clone, Debug, Serialize)]
pub struct ActionDone {
    /// The action (`forget`, `forget-group`, `release`, `replay`, `replay-group`,
    /// `outbox-retry`, `purge`).
    pub action: String,
    /// Records or rows it changed (0: nothing, e.g. a key holding a live lease is not
    /// forgotten).
    pub changed: u64,
    /// What it did, in words.
    pub message: String,
}

/// `GET /api/session`.
#[derive(Clone, Debug, Serialize)]
pub struct Session {
    /// The CSRF token every write carries (`csrf` in its form or JSON body).
    pub csrf: String,
    /// Whether this console was started with writes allowed.
    pub writes_allowed: bool,
    /// Whether this request carries the token (or the host authenticates).
    pub authenticated: bool,
}

/// The JSON answer of a refused or failed `/api` request.
#[derive(Clone, Debug, Serialize)]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// Why, for the operator.
    pub error: String,
}

/// `GET /api/flow`: per minute over the last hour, from counts the console sampled
/// itself (see the README's "Where the flow comes from").
#[derive(Clone, Debug, Serialize)]
pub struct Flow {
    /// Where the figures come from: `sampled` (the console read the counts).
    pub source: &'static str,
    /// How often the console samples by itself, in milliseconds (0: only when the
    /// overview is read).
    pub sample_every_ms: u64,
    /// The start of the first minute (each series has 60 values, one per minute, the
    /// last one the minute now running).
    pub since: i64,
    /// A minute, in milliseconds.
    pub minute_ms: i64,
    /// Samples kept.
    pub samples: usize,
    /// When the oldest sample kept was taken (`None`: none yet; the console started
    /// empty).
    pub first_sample_at: Option<i64>,
    /// One line per consumer, in name order.
    pub consumers: Vec<ConsumerFlow>,
    /// The outbox, when the console has one and sampled it.
    pub outbox: Option<OutboxFlow>,
    /// Each broker backlog the console reads, in name order.
    pub brokers: Vec<BacklogFlow>,
}

/// One consumer's flow. A value is `null` for a minute no two samples span.
#[derive(Clone, Debug, Serialize)]
pub struct ConsumerFlow {
    /// The consumer.
    pub consumer: String,
    /// Records newly processed, per minute.
    pub processed: Vec<Option<u64>>,
    /// Records newly failed or dead-lettered, per minute.
    pub failed: Vec<Option<u64>>,
}

/// The outbox over time. A value is `null` for a minute with no sample.
#[derive(Clone, Debug, Serialize)]
pub struct OutboxFlow {
    /// The largest lag (the oldest unsent row's age) sampled in each minute, in ms.
    pub lag_ms: Vec<Option<u64>>,
    /// Rows pending or held at the minute's last sample.
    pub waiting: Vec<Option<u64>>,
}

/// A broker's backlog over time, as the broker reports it.
#[derive(Clone, Debug, Serialize)]
pub struct BacklogFlow {
    /// Its name (the queue or topic, and its consumer).
    pub name: String,
    /// What it counts (`consumer-group lag`, `queue depth`).
    pub what: &'static str,
    /// The count at the minute's last sample (`null`: none read).
    pub waiting: Vec<Option<u64>>,
}

/// `GET /healthz` and `GET /readyz`: the probes, without the token. It names each
/// probe and says how it is; it never holds a URL, a key or an error's text.
#[derive(Clone, Debug, Serialize)]
pub struct Health {
    /// `ok`, or `fail` (answered with 503).
    pub status: &'static str,
    /// Every probe is live.
    pub live: bool,
    /// Every probe is ready.
    pub ready: bool,
    /// Each probe: the console's store first, then those the application added.
    pub probes: Vec<ProbeLine>,
}

/// One probe's answer.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeLine {
    /// Its name (`store`, `consumer orders`, `relay`).
    pub name: String,
    /// Ready.
    pub ready: bool,
    /// Live.
    pub live: bool,
    /// `ok`, or why not in a few words.
    pub detail: &'static str,
    /// Whether it holds its broker connection (consumers, the relay).
    pub connected: Option<bool>,
    /// Messages in flight (consumers), or outbox rows waiting (the relay).
    pub in_flight: Option<u64>,
    /// When it last settled a message or published a row.
    pub last_activity: Option<i64>,
}
