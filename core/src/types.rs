//! The values that flow through a [`DedupStore`](crate::DedupStore).

use std::fmt;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::{Error, Failure, Key, Result, Timestamp, Verdict};

/// Largest outcome a commit may store, in bytes (64 KiB). Outcomes are meant for a small
/// response summary that duplicates get back, not for payloads.
pub const MAX_OUTCOME_LEN: usize = 64 * 1024;

/// Longest fingerprint accepted, in bytes.
pub const MAX_FINGERPRINT_LEN: usize = 128;

/// Most items one `claim_many` / `commit_many` call accepts.
pub const MAX_BATCH_LEN: usize = 1000;

/// Shortest lease accepted.
pub const MIN_LEASE: Duration = Duration::from_millis(1);

/// Longest lease accepted (30 days).
pub const MAX_LEASE: Duration = Duration::from_secs(30 * 24 * 3600);

/// A short string identifying a message's payload, stored with its record.
///
/// A claim that carries a fingerprint different from the stored one fails with
/// [`Error::FingerprintMismatch`]: the producer reused a message id for a different
/// payload, which is a bug to surface, not a duplicate to swallow.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// The lowercase hex SHA-256 of `payload` (64 characters).
    pub fn of_payload(payload: &[u8]) -> Self {
        Fingerprint(hex(&Sha256::digest(payload)))
    }

    /// A caller-chosen fingerprint (a content hash, a version): 1 to
    /// [`MAX_FINGERPRINT_LEN`] bytes, no NUL.
    pub fn new(value: impl Into<String>) -> Result<Self> {
        let value = value.into();
        if value.is_empty() || value.len() > MAX_FINGERPRINT_LEN {
            return Err(Error::invalid(
                "fingerprint",
                format!("must be 1 to {MAX_FINGERPRINT_LEN} bytes"),
            ));
        }
        if value.contains('\0') {
            return Err(Error::invalid("fingerprint", "must not contain NUL bytes"));
        }
        Ok(Fingerprint(value))
    }

    /// The fingerprint as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.0)
    }
}

/// `bytes` as lowercase hex. A table, not `write!` per byte: this runs for every message
/// (trace ids, idempotency keys), and the formatting machinery cost more than the rest of
/// a trace's bookkeeping.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// How to claim a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimOptions {
    /// How long the lease lasts before another worker may take the key over. Pick it longer
    /// than the handler's usual run time, or renew (the [`Inbox`](crate::Inbox) renews for you).
    pub lease: Duration,
    /// The payload's fingerprint, checked against the stored one (see [`Fingerprint`]).
    pub fingerprint: Option<Fingerprint>,
}

impl Default for ClaimOptions {
    /// A 30-second lease, no fingerprint.
    fn default() -> Self {
        ClaimOptions {
            lease: Duration::from_secs(30),
            fingerprint: None,
        }
    }
}

impl ClaimOptions {
    /// Options with the given lease and no fingerprint.
    pub fn lease(lease: Duration) -> Self {
        ClaimOptions {
            lease,
            fingerprint: None,
        }
    }

    /// The same options carrying `fingerprint`.
    pub fn with_fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// Check the options against the contract's limits.
    pub fn validate(&self) -> Result<()> {
        validate_lease(self.lease)
    }
}

/// Check a lease (or renewal) duration: between [`MIN_LEASE`] and [`MAX_LEASE`].
pub fn validate_lease(lease: Duration) -> Result<()> {
    if lease < MIN_LEASE || lease > MAX_LEASE {
        return Err(Error::invalid(
            "lease",
            format!("{lease:?} is outside {MIN_LEASE:?}..={MAX_LEASE:?}"),
        ));
    }
    Ok(())
}

/// Check an outcome's size: at most [`MAX_OUTCOME_LEN`] bytes.
pub fn validate_outcome(outcome: Option<&[u8]>) -> Result<()> {
    match outcome {
        Some(o) if o.len() > MAX_OUTCOME_LEN => Err(Error::invalid(
            "outcome",
            format!("{} bytes, at most {MAX_OUTCOME_LEN} allowed", o.len()),
        )),
        _ => Ok(()),
    }
}

/// Check a batch's length: at most [`MAX_BATCH_LEN`] items.
pub fn validate_batch_len(len: usize) -> Result<()> {
    if len > MAX_BATCH_LEN {
        return Err(Error::invalid(
            "batch",
            format!("{len} items, at most {MAX_BATCH_LEN} allowed"),
        ));
    }
    Ok(())
}

/// The random identity of one lease: proves "I am the worker that claimed this".
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseToken(uuid::Uuid);

impl LeaseToken {
    /// A fresh random token.
    pub fn random() -> Self {
        LeaseToken(uuid::Uuid::new_v4())
    }

    /// From a stored UUID.
    pub fn from_uuid(u: uuid::Uuid) -> Self {
        LeaseToken(u)
    }

    /// Parse the stored text form; `None` when it is not a UUID.
    pub fn parse(s: &str) -> Option<Self> {
        uuid::Uuid::parse_str(s).ok().map(LeaseToken)
    }

    /// The UUID.
    pub fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({})", self.0.hyphenated())
    }
}

/// What a successful claim returns: the right to process a key until `expires_at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The key this lease is for.
    pub key: Key,
    /// The random token that fences commit / renew / release.
    pub token: LeaseToken,
    /// Grows by one every time the key changes hands (1 for the first claim). Pass it to
    /// downstream systems that can reject writes from a stale owner.
    pub fence: u64,
    /// Which delivery attempt this is (1 for the first claim, +1 per takeover).
    pub attempt: u32,
    /// When the lease expires by the store's clock, unless renewed.
    pub expires_at: Timestamp,
}

impl Lease {
    /// A stable idempotency key for external calls (payment providers and other APIs that
    /// dedupe by key): the same string on every attempt for this key, different for every
    /// other key or consumer. `dedup-` followed by 64 hex characters (70 in all).
    pub fn idempotency_key(&self) -> String {
        idempotency_key(&self.key)
    }
}

/// The idempotency key of [`Lease::idempotency_key`], computed from a key alone.
pub fn idempotency_key(key: &Key) -> String {
    let mut h = Sha256::new();
    h.update(key.consumer().as_bytes());
    h.update([0u8]);
    h.update(key.message_id().as_bytes());
    format!("dedup-{}", hex(&h.finalize()))
}

/// The result of a claim. Only `Acquired` means "process this message now".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// You hold the key: process it, then commit (or release on failure).
    Acquired(Lease),
    /// Another worker holds a live lease: do not process; redeliver later (after
    /// `expires_at` the key can be taken over).
    InFlight {
        /// When the live lease expires.
        expires_at: Timestamp,
        /// The attempt number of the live lease.
        attempt: u32,
    },
    /// Already processed: acknowledge the message without processing it again.
    Completed {
        /// When it was committed, by the store's clock.
        processed_at: Timestamp,
        /// The outcome stored by the commit, byte for byte (`None` if it stored none).
        outcome: Option<Vec<u8>>,
    },
}

impl Claim {
    /// The lease, when acquired.
    pub fn lease(&self) -> Option<&Lease> {
        match self {
            Claim::Acquired(l) => Some(l),
            _ => None,
        }
    }

    /// The lease, when acquired (by value).
    pub fn into_lease(self) -> Option<Lease> {
        match self {
            Claim::Acquired(l) => Some(l),
            _ => None,
        }
    }

    /// Whether this is `Acquired`.
    pub fn is_acquired(&self) -> bool {
        matches!(self, Claim::Acquired(_))
    }
}

/// One item of [`DedupStore::claim_many`](crate::DedupStore::claim_many).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The key to claim.
    pub key: Key,
    /// Lease duration and fingerprint for this key.
    pub options: ClaimOptions,
}

impl ClaimRequest {
    /// A request for `key` with `options`.
    pub fn new(key: Key, options: ClaimOptions) -> Self {
        ClaimRequest { key, options }
    }
}

/// One item of [`DedupStore::commit_many`](crate::DedupStore::commit_many).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitRequest {
    /// The lease to commit.
    pub lease: Lease,
    /// The outcome to store.
    pub outcome: Option<Vec<u8>>,
}

/// The stored state of a key, as returned by [`DedupStore::get`](crate::DedupStore::get).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The key.
    pub key: Key,
    /// The fence of the latest acquisition.
    pub fence: u64,
    /// The attempt number of the latest acquisition.
    pub attempt: u32,
    /// The fingerprint stored with the record, if any claim carried one.
    pub fingerprint: Option<Fingerprint>,
    /// When the key was first claimed, by the store's clock: the first acquisition (or
    /// transactional claim) that created the record, kept through takeovers, releases and
    /// the commit (MassTransit's `Received`). `None` where the backend does not keep it
    /// (Redis) and for records written before the store kept it.
    pub first_claimed_at: Option<Timestamp>,
    /// The cause of the latest attempt that failed and released the key
    /// ([`DedupStore::release_failed`](crate::DedupStore::release_failed)). Takeovers,
    /// renewals, plain releases and the commit keep it; the next `release_failed` replaces
    /// it; purge and forget remove it with the record. A failed or dead-lettered key keeps
    /// its final cause in its outcome too (see [`Record::failure`]).
    pub last_failure: Option<Failure>,
    /// In flight or completed.
    pub state: RecordState,
}

impl Record {
    /// What the completed record's outcome holds (`None` in flight): a handler's outcome,
    /// a stored failure or a dead letter.
    pub fn verdict(&self) -> Option<Verdict> {
        match &self.state {
            RecordState::Completed { outcome, .. } => Some(Verdict::decode(outcome.clone())),
            RecordState::InFlight { .. } => None,
        }
    }

    /// The cause an operator looks at: the one a failed or dead-lettered key was settled
    /// with, otherwise the latest released failure ([`Record::last_failure`]).
    pub fn failure(&self) -> Option<Failure> {
        self.verdict()
            .and_then(|v| v.cause().cloned())
            .or_else(|| self.last_failure.clone())
    }
}

/// The two states a stored record can be in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordState {
    /// Claimed and not committed. The lease may have expired (`expires_at` <= now) or been
    /// released (`expires_at` set to the release time).
    InFlight {
        /// The token of the latest lease.
        token: LeaseToken,
        /// When that lease expires or expired.
        expires_at: Timestamp,
    },
    /// Processed.
    Completed {
        /// The token of the committing lease (`None` when claimed inside a caller's SQL
        /// transaction, which needs no lease).
        token: Option<LeaseToken>,
        /// When it was committed.
        processed_at: Timestamp,
        /// The stored outcome.
        outcome: Option<Vec<u8>>,
    },
}

/// How to purge. Build it with [`PurgeOptions::older_than`] and the builder methods.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PurgeOptions {
    /// Remove completed records processed longer ago than this, and in-flight records whose
    /// lease expired longer ago than this. Live leases are never removed. Choose it longer
    /// than the longest time a broker may redeliver a message (including DLQ replays): a
    /// duplicate that arrives after its record was purged is processed again.
    pub retention: Duration,
    /// How many records one batch (one statement / transaction / script) removes at most.
    pub batch_size: usize,
    /// Stop after this many batches (`None`: until nothing is left to remove).
    pub max_batches: Option<u32>,
    /// How the batches share the storage with live traffic (default: [`Pace::default`]).
    pub pace: Pace,
}

/// How a purge shares the storage with live claims and commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// Batches of `batch_size`, back to back: the fastest purge, for maintenance windows.
    /// Claims may wait behind each whole batch.
    Unpaced,
    /// Background work: each batch is sized so it takes about `max_batch_time` at most
    /// (the size adapts, never above `batch_size`), and the purge rests between batches
    /// so it is busy at most `busy_percent` of the time. Both count the time a batch held
    /// the storage, as its backend measured it ([`PurgeBatch::work`]), not the time it
    /// waited for its turn behind live traffic.
    ///
    /// [`PurgeBatch::work`]: crate::backend::PurgeBatch::work
    Paced {
        /// The time one batch should hold the storage at most.
        max_batch_time: Duration,
        /// The share of time (1 to 100) the purge may keep the storage busy.
        busy_percent: u8,
    },
}

impl Default for Pace {
    /// Batches of about 1 ms at most, busy a quarter of the time.
    ///
    /// A claim that meets a batch (SQLite: waits for its lock; Redis: queues behind its
    /// round trip; PostgreSQL: shares the server's CPU with it) is delayed by about that
    /// batch: 1 ms keeps that within the latency of a claim+commit on a local server.
    fn default() -> Self {
        Pace::Paced {
            max_batch_time: Duration::from_millis(1),
            busy_percent: 25,
        }
    }
}

impl PurgeOptions {
    /// Purge everything older than `retention`, in batches of at most 1000, paced
    /// ([`Pace::default`]).
    pub fn older_than(retention: Duration) -> Self {
        PurgeOptions {
            retention,
            batch_size: 1000,
            max_batches: None,
            pace: Pace::default(),
        }
    }

    /// The same options with another (largest) batch size.
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// The same options, stopping after `max_batches` batches.
    pub fn max_batches(mut self, max_batches: u32) -> Self {
        self.max_batches = Some(max_batches);
        self
    }

    /// The same options with another pace.
    pub fn pace(mut self, pace: Pace) -> Self {
        self.pace = pace;
        self
    }

    /// The same options, unpaced ([`Pace::Unpaced`]): for maintenance windows.
    pub fn unpaced(self) -> Self {
        self.pace(Pace::Unpaced)
    }

    /// Check the options: batch size 1 to 100 000; a paced purge's batch time 1 µs to
    /// 10 s and busy share 1 to 100 %.
    pub fn validate(&self) -> Result<()> {
        if self.batch_size == 0 || self.batch_size > 100_000 {
            return Err(Error::invalid(
                "purge batch size",
                format!("{} is outside 1..=100000", self.batch_size),
            ));
        }
        if let Pace::Paced {
            max_batch_time,
            busy_percent,
        } = self.pace
        {
            if max_batch_time < Duration::from_micros(1) || max_batch_time > Duration::from_secs(10)
            {
                return Err(Error::invalid(
                    "purge batch time",
                    format!("{max_batch_time:?} is outside 1µs..=10s"),
                ));
            }
            if !(1..=100).contains(&busy_percent) {
                return Err(Error::invalid(
                    "purge busy share",
                    format!("{busy_percent}% is outside 1..=100"),
                ));
            }
        }
        Ok(())
    }
}

/// What a purge removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PurgeReport {
    /// Completed records removed.
    pub completed: u64,
    /// Expired in-flight records removed.
    pub expired: u64,
    /// Batches run (including the last one, which may have removed nothing).
    pub batches: u32,
    /// How long the purge took, rests between paced batches included.
    pub elapsed: Duration,
    /// Whether it stopped at [`PurgeOptions::max_batches`] before finding nothing more to
    /// remove: records it could have removed may be left.
    pub stopped_early: bool,
}

impl PurgeReport {
    /// Records removed in all.
    pub fn total(&self) -> u64 {
        self.completed + self.expired
    }

    /// Records removed per second (0 when nothing was removed or no time passed).
    pub fn rate(&self) -> f64 {
        match self.elapsed.as_secs_f64() {
            secs if secs > 0.0 => self.total() as f64 / secs,
            _ => 0.0,
        }
    }
}

/// What a store can do, as plain flags (check before relying on one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Records survive dropping and reopening the store (and a process restart).
    pub persistent: bool,
    /// Several OS processes may share the storage and keep the contract.
    pub multi_process: bool,
    /// `claim_many` / `commit_many` run in one round trip rather than one per item.
    pub native_batch: bool,
    /// The storage expires records by itself after the store's configured retention (Redis);
    /// `purge` is then needed only for a retention shorter than that.
    pub native_ttl: bool,
    /// Claims can join the caller's database transaction (SQL backends, as an extension
    /// on the store type).
    pub transactional: bool,
    /// Lease time comes from the server's clock by default.
    pub server_clock: bool,
    /// Records keep when their key was first claimed ([`Record::first_claimed_at`]).
    pub first_claim_time: bool,
    /// [`release_failed`](crate::DedupStore::release_failed) keeps the failure on the
    /// record ([`Record::last_failure`]); without it, it answers
    /// [`Error::Unsupported`](crate::Error::Unsupported) and writes nothing, and the
    /// [`Inbox`](crate::Inbox) releases the lease without the cause (its log line still
    /// has it, and failed and dead-lettered keys keep theirs in their outcome).
    pub failure_causes: bool,
}

/// The result of claiming a key inside the caller's own SQL transaction (the SQL backends'
/// transactional extension). The inbox row commits or rolls back with the caller's
/// business rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxClaim {
    /// The key is yours inside this transaction: a completed record was written (or an
    /// expired lease-mode record taken over, fence+1) and becomes visible when the
    /// transaction commits. Do the work in the same transaction. On rollback no record
    /// is left and the next delivery claims normally.
    Claimed {
        /// The fence of this acquisition.
        fence: u64,
    },
    /// Another worker's live lease-mode claim holds the key.
    InFlight {
        /// When that lease expires.
        expires_at: Timestamp,
        /// Its attempt number.
        attempt: u32,
    },
    /// Already processed (by a committed transaction or a lease-mode commit).
    Completed {
        /// When.
        processed_at: Timestamp,
        /// The stored outcome.
        outcome: Option<Vec<u8>>,
    },
}
