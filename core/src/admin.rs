//! The operator's view of a store: listing, counting, releasing and forgetting records by
//! hand.
//!
//! [`DedupStore`] is what consumers need; an operator answering "is this message processed,
//! who holds it, how many are stuck" needs a few more questions answered. [`Admin`] is that
//! extension, implemented by [`MemoryStore`](crate::MemoryStore) and every backend, and used
//! as `dyn Admin` by the `dedup` command line.
//!
//! These are maintenance operations, not hot-path ones: [`Admin::stats`] reads the whole
//! store (an aggregate query on SQL backends, a `SCAN` of the key prefix on Redis) unless
//! the store keeps counts ([`Admin::enable_counts`], opt-in), and [`Admin::list`] reads one
//! consumer's records in key order, one page at a time.

mod groups;

use async_trait::async_trait;
use std::time::Duration;

pub use groups::{FailureGroupOf, failure_group, first_line, group_id};

use crate::{DedupStore, Error, Key, Record, RecordState, Result, Timestamp};

/// Most records one [`Admin::list`] call returns.
pub const MAX_LIST_LIMIT: usize = 10_000;

/// Most keys [`Stats::most_retried`] may be asked for.
pub const MAX_TOP: usize = 1_000;

/// The state of a record as an operator sees it at one instant.
///
/// A completed record is in one of three states, told apart by its outcome bytes (see
/// [`Verdict`](crate::Verdict)): processed (a handler's outcome), failed (a failure stored
/// as the key's result) or dead-lettered (the key used up its attempts). A backend that
/// filters or counts in its query language compares the outcome's first bytes with
/// [`FAILED_PREFIX`](crate::FAILED_PREFIX) and [`DEAD_LETTER_PREFIX`](crate::DEAD_LETTER_PREFIX).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    /// In flight, and its lease is live: a worker is processing it now.
    InFlight,
    /// In flight, but its lease expired or was released: the next delivery takes it over.
    Expired,
    /// Processed: completed with a handler's outcome (duplicates are acknowledged).
    Completed,
    /// Completed with a failure stored as its result
    /// ([`FailurePolicy::Store`](crate::FailurePolicy::Store)).
    Failed,
    /// Completed as dead-lettered: the key used up its attempts.
    DeadLettered,
}

impl Status {
    /// Every status, in display order.
    pub const ALL: [Status; 5] = [
        Status::InFlight,
        Status::Expired,
        Status::Completed,
        Status::Failed,
        Status::DeadLettered,
    ];

    /// The status of `record` at `now` (a lease is live while `now < expires_at`).
    pub fn of(record: &Record, now: Timestamp) -> Self {
        match &record.state {
            RecordState::InFlight { expires_at, .. } if now < *expires_at => Status::InFlight,
            RecordState::InFlight { .. } => Status::Expired,
            RecordState::Completed { outcome, .. } => Status::of_outcome(outcome.as_deref()),
        }
    }

    /// The status of a completed record holding `outcome`.
    pub fn of_outcome(outcome: Option<&[u8]>) -> Self {
        match outcome {
            Some(o) if o.starts_with(crate::FAILED_PREFIX) => Status::Failed,
            Some(o) if o.starts_with(crate::DEAD_LETTER_PREFIX) => Status::DeadLettered,
            _ => Status::Completed,
        }
    }

    /// Whether the record is completed (processed, failed or dead-lettered).
    pub fn is_completed(self) -> bool {
        matches!(
            self,
            Status::Completed | Status::Failed | Status::DeadLettered
        )
    }

    /// The name the command line uses: `in-flight`, `expired`, `completed`, `failed`,
    /// `dead-letter`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::InFlight => "in-flight",
            Status::Expired => "expired",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::DeadLettered => "dead-letter",
        }
    }
}

/// Which records [`Admin::list`] returns: one consumer's, in message id order (byte order),
/// starting after a message id (keyset paging: pass the last id of the previous page).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListFilter {
    /// The consumer whose records to list (records of other consumers are never listed).
    pub consumer: String,
    /// Only records in this status (`None`: all).
    pub status: Option<Status>,
    /// Only message ids greater than this one (`None`: from the start).
    pub after: Option<String>,
    /// At most this many records (1 to [`MAX_LIST_LIMIT`]).
    pub limit: usize,
}

impl ListFilter {
    /// The first 100 records of `consumer`, any status.
    pub fn consumer(consumer: impl Into<String>) -> Self {
        ListFilter {
            consumer: consumer.into(),
            status: None,
            after: None,
            limit: 100,
        }
    }

    /// The same filter, keeping only records in `status`.
    pub fn status(mut self, status: Status) -> Self {
        self.status = Some(status);
        self
    }

    /// The same filter, starting after `message_id`.
    pub fn after(mut self, message_id: impl Into<String>) -> Self {
        self.after = Some(message_id.into());
        self
    }

    /// The same filter with another limit.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Check the filter: a valid consumer name, a limit of 1 to [`MAX_LIST_LIMIT`].
    pub fn validate(&self) -> Result<()> {
        Key::new(self.consumer.clone(), "x")?;
        if self.limit == 0 || self.limit > MAX_LIST_LIMIT {
            return Err(Error::invalid(
                "list limit",
                format!("{} is outside 1..={MAX_LIST_LIMIT}", self.limit),
            ));
        }
        Ok(())
    }

    /// Whether `record` passes this filter at `now` (consumer, status and `after`; not the
    /// limit). For backends that filter in memory.
    pub fn accepts(&self, record: &Record, now: Timestamp) -> bool {
        record.key.consumer() == self.consumer
            && self
                .after
                .as_deref()
                .is_none_or(|after| record.key.message_id() > after)
            && self.status.is_none_or(|s| Status::of(record, now) == s)
    }
}

/// A key and the numbers an operator looks at first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySummary {
    /// The key.
    pub key: Key,
    /// Its status when the stats were taken.
    pub status: Status,
    /// Its latest attempt number.
    pub attempt: u32,
    /// Its latest fence.
    pub fence: u64,
    /// When its lease expires (in flight) or when it was processed (completed).
    pub at: Timestamp,
}

impl KeySummary {
    /// The summary of `record` at `now`.
    pub fn of(record: &Record, now: Timestamp) -> Self {
        KeySummary {
            key: record.key.clone(),
            status: Status::of(record, now),
            attempt: record.attempt,
            fence: record.fence,
            at: match &record.state {
                RecordState::InFlight { expires_at, .. } => *expires_at,
                RecordState::Completed { processed_at, .. } => *processed_at,
            },
        }
    }
}

/// What [`Admin::stats`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// The store's "now" the counts were taken at.
    pub now: Timestamp,
    /// In-flight records with a live lease.
    pub in_flight: u64,
    /// In-flight records whose lease expired or was released.
    pub expired: u64,
    /// Processed records: completed with a handler's outcome (failed and dead-lettered
    /// ones are not counted here).
    pub completed: u64,
    /// Completed records holding a stored failure.
    pub failed: u64,
    /// Dead-lettered records.
    pub dead_lettered: u64,
    /// The live lease that expires first. Stores do not keep when a lease was first
    /// acquired (renewals move the expiry), so "oldest" is judged by expiry: with one
    /// lease duration for every worker, it is the longest-held live lease.
    pub oldest_live: Option<KeySummary>,
    /// The keys with the highest attempt numbers (most retried first; ties in key order),
    /// at most as many as asked, only keys retried at least once (attempt >= 2).
    pub most_retried: Vec<KeySummary>,
    /// The storage's size in bytes, where the backend can tell (table and indexes on
    /// PostgreSQL, the database file on SQLite); `None` otherwise.
    pub size_bytes: Option<u64>,
}

impl Stats {
    /// Empty stats taken at `now` (the backends fill in the rest).
    pub fn at(now: Timestamp) -> Self {
        Stats {
            now,
            in_flight: 0,
            expired: 0,
            completed: 0,
            failed: 0,
            dead_lettered: 0,
            oldest_live: None,
            most_retried: Vec::new(),
            size_bytes: None,
        }
    }

    /// Records in all.
    pub fn total(&self) -> u64 {
        self.in_flight + self.expired + self.completed + self.failed + self.dead_lettered
    }

    /// How many records are in `status`.
    pub fn count(&self, status: Status) -> u64 {
        match status {
            Status::InFlight => self.in_flight,
            Status::Expired => self.expired,
            Status::Completed => self.completed,
            Status::Failed => self.failed,
            Status::DeadLettered => self.dead_lettered,
        }
    }

    /// The count of `status`, to fill in.
    pub fn count_mut(&mut self, status: Status) -> &mut u64 {
        match status {
            Status::InFlight => &mut self.in_flight,
            Status::Expired => &mut self.expired,
            Status::Completed => &mut self.completed,
            Status::Failed => &mut self.failed,
            Status::DeadLettered => &mut self.dead_lettered,
        }
    }

    /// Count `record` at `now`, and keep it if it is the oldest live lease or among the
    /// `top` most retried. For backends that compute stats by reading records one by one.
    pub fn add(&mut self, record: &Record, top: usize) {
        let summary = KeySummary::of(record, self.now);
        *self.count_mut(summary.status) += 1;
        if summary.status == Status::InFlight
            && self
                .oldest_live
                .as_ref()
                .is_none_or(|o| (summary.at, &summary.key) < (o.at, &o.key))
        {
            self.oldest_live = Some(summary.clone());
        }
        if summary.attempt >= 2 && top > 0 {
            self.most_retried.push(summary);
            sort_most_retried(&mut self.most_retried);
            self.most_retried.truncate(top);
        }
    }
}

/// Where [`Admin::consumers`] and [`Admin::stats`] take their counts by status from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountSource {
    /// Every record is read (an aggregate query over the table, a `SCAN` on Redis): exact,
    /// at a cost that grows with the store. `keepable`: the store could keep its counts
    /// instead ([`Admin::enable_counts`], `dedup counts enable`).
    Scan {
        /// Whether [`Admin::enable_counts`] is available on this store.
        keepable: bool,
    },
    /// Counts the store keeps as records change (enabled by [`Admin::enable_counts`]), plus
    /// the in-flight records, read through an index of their own, to tell expired leases
    /// from live ones: a cost that grows with the records in flight only.
    Kept,
}

impl CountSource {
    /// `scan` or `kept`, as the command line and the console's JSON say it.
    pub fn as_str(self) -> &'static str {
        match self {
            CountSource::Scan { .. } => "scan",
            CountSource::Kept => "kept",
        }
    }
}

/// Most consumers [`Admin::consumers`] returns.
pub const MAX_CONSUMERS: usize = 10_000;

/// One consumer a store holds records of, with its records counted by status (see
/// [`Admin::consumers`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerCounts {
    /// The consumer's name.
    pub consumer: String,
    /// Its records by status, as of [`Stats::now`] (only the counts are filled in).
    pub counts: Stats,
}

impl ConsumerCounts {
    /// A consumer with no record counted yet, at `now`.
    pub fn new(consumer: impl Into<String>, now: Timestamp) -> Self {
        ConsumerCounts {
            consumer: consumer.into(),
            counts: Stats::at(now),
        }
    }

    /// Count `records` (read one by one) into per-consumer counts: see [`ConsumerTally`].
    pub fn tally<'a>(records: impl IntoIterator<Item = &'a Record>, now: Timestamp) -> Vec<Self> {
        let mut tally = ConsumerTally::at(now);
        for record in records {
            tally.add(record);
        }
        tally.finish()
    }
}

/// Per-consumer counts of records read one by one, for backends without a `GROUP BY`: at
/// most [`MAX_CONSUMERS`] consumers, the first in name order (records of others are not
/// counted).
#[derive(Debug)]
pub struct ConsumerTally {
    now: Timestamp,
    by_consumer: std::collections::BTreeMap<String, Stats>,
}

impl ConsumerTally {
    /// An empty tally of statuses at `now`.
    pub fn at(now: Timestamp) -> Self {
        ConsumerTally {
            now,
            by_consumer: std::collections::BTreeMap::new(),
        }
    }

    /// Count `record`.
    pub fn add(&mut self, record: &Record) {
        let consumer = record.key.consumer();
        if !self.by_consumer.contains_key(consumer) {
            if self.by_consumer.len() >= MAX_CONSUMERS {
                match self.by_consumer.last_key_value() {
                    Some((last, _)) if last.as_str() > consumer => {
                        self.by_consumer.pop_last();
                    }
                    _ => return,
                }
            }
            self.by_consumer
                .insert(consumer.to_owned(), Stats::at(self.now));
        }
        if let Some(stats) = self.by_consumer.get_mut(consumer) {
            *stats.count_mut(Status::of(record, self.now)) += 1;
        }
    }

    /// The counts, in consumer name order.
    pub fn finish(self) -> Vec<ConsumerCounts> {
        self.by_consumer
            .into_iter()
            .map(|(consumer, counts)| ConsumerCounts { consumer, counts })
            .collect()
    }
}

/// Order keys most retried first, ties in key order.
pub fn sort_most_retried(keys: &mut [KeySummary]) {
    keys.sort_by(|a, b| b.attempt.cmp(&a.attempt).then_with(|| a.key.cmp(&b.key)));
}

/// Check how many most retried keys were asked for: at most [`MAX_TOP`].
pub fn validate_top(top: usize) -> Result<()> {
    if top > MAX_TOP {
        return Err(Error::invalid(
            "top",
            format!("{top} is outside 0..={MAX_TOP}"),
        ));
    }
    Ok(())
}

/// How many records a purge would remove (see [`Admin::count_purgeable`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PurgeCount {
    /// Completed records processed before the cutoff.
    pub completed: u64,
    /// In-flight records whose lease expired before the cutoff.
    pub expired: u64,
}

impl PurgeCount {
    /// Records in all.
    pub fn total(&self) -> u64 {
        self.completed + self.expired
    }

    /// Count `record` if a purge with `retention` at `now` removes it. For backends that
    /// count by reading records one by one.
    pub fn add(&mut self, record: &Record, now: Timestamp, retention: Duration) {
        match crate::backend::transition::purgeable(record, now, retention) {
            Some(crate::backend::transition::Purgeable::Completed) => self.completed += 1,
            Some(crate::backend::transition::Purgeable::Expired) => self.expired += 1,
            None => {}
        }
    }
}

/// What an operator release did (see [`Admin::release_key`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Released {
    /// The key's lease was revoked: its worker's commit, renew and release get `LeaseLost`
    /// from now on, and the next claim takes the key over with fence + 1 and attempt + 1.
    Released {
        /// The fence of the revoked lease.
        fence: u64,
        /// Its attempt number.
        attempt: u32,
        /// Whether the lease was live (released with `force`) rather than already expired.
        was_live: bool,
    },
    /// Refused: the lease is live and `force` was not given. Nothing changed.
    LiveLease {
        /// When the live lease expires.
        expires_at: Timestamp,
        /// Its attempt number.
        attempt: u32,
    },
    /// The key is completed: there is no lease to release. Nothing changed.
    Completed {
        /// When it was processed.
        processed_at: Timestamp,
    },
    /// The key has no record.
    NotFound,
}

/// What an operator's forget did (see [`Admin::forget`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Forgot {
    /// The record was removed: the next delivery of the message is processed as new, with
    /// fence 1 and attempt 1, and a worker that held its lease gets `LeaseLost`.
    Forgot {
        /// Its status when it was removed (`InFlight` only with `force`).
        status: Status,
        /// Its fence.
        fence: u64,
        /// Its attempt number.
        attempt: u32,
    },
    /// Refused: the record holds a live lease and `force` was not given. Nothing changed.
    LiveLease {
        /// When the live lease expires.
        expires_at: Timestamp,
        /// Its attempt number.
        attempt: u32,
    },
    /// The key has no record. Nothing changed.
    NotFound,
}

/// The operator's extension of [`DedupStore`]: listing, counting, releasing and forgetting
/// by hand.
///
/// Every store implements it. Used as `dyn Admin`: it has `DedupStore` as a supertrait,
/// so one handle does both. `dedup::open_admin` opens one from a URL. "Now" is the
/// store's clock, the one its leases use.
///
/// # Examples
///
/// ```
/// use dedup_core::{Admin, ClaimOptions, DedupStore, Key, ListFilter, MemoryStore, Status};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dedup_core::Error> {
/// let store = MemoryStore::new();
/// let key = Key::new("billing", "order-42")?;
/// let lease = store.claim(&key, &ClaimOptions::default()).await?.into_lease().unwrap();
/// store.commit(&lease, None).await?;
///
/// let stats = store.stats(10).await?;
/// assert_eq!(stats.completed, 1);
/// let done = store.list(&ListFilter::consumer("billing").status(Status::Completed)).await?;
/// assert_eq!(done.len(), 1);
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// Every method can fail with [`Error::Backend`] when the storage fails. Bad input (an
/// invalid consumer name, a limit out of range) is [`Error::InvalidInput`], before
/// anything is read. Each method lists its own further errors.
///
/// # Cancel safety
///
/// The reads are cancel safe. [`release_key`](Self::release_key) and
/// [`forget`](Self::forget) are atomic: a dropped call did all or nothing.
#[async_trait]
pub trait Admin: DedupStore {
    /// The store's current time (the server's clock, or the injected one).
    async fn now(&self) -> Result<Timestamp>;

    /// Records of one consumer matching `filter`, in message id order.
    ///
    /// At most `filter.limit` of them. Never a record of another consumer. Page with
    /// [`ListFilter::after`] and the last message id.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an invalid filter ([`ListFilter::validate`]).
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>>;

    /// Counts by status, the oldest live lease, the `top` most retried keys and the size.
    ///
    /// All as of one reading of the store's clock. It reads the whole store, unless the
    /// store keeps counts ([`enable_counts`](Self::enable_counts)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] when `top` is out of range.
    async fn stats(&self, top: usize) -> Result<Stats>;

    /// The consumers the store holds records of, in name order, each with its records
    /// counted by status (processed, failed, dead-lettered, in flight, expired), as of one
    /// reading of the store's clock. At most [`MAX_CONSUMERS`] consumers: the first ones
    /// in name order. Reads the whole store, like [`stats`](Self::stats): an aggregate
    /// query grouped by consumer on the SQL backends, a `SCAN` of the key prefix on Redis;
    /// a store that keeps counts ([`enable_counts`](Self::enable_counts)) reads those.
    async fn consumers(&self) -> Result<Vec<ConsumerCounts>>;

    /// How many records [`DedupStore::purge`] with `retention` would remove now, removing
    /// none (a dry run). Records keep ageing, so a purge run later may remove more.
    async fn count_purgeable(&self, retention: Duration) -> Result<PurgeCount>;

    /// The last purge of this store's records that finished, whichever process ran it
    /// (`None`: none finished since the store was created). See [`PurgeRun`](crate::PurgeRun).
    async fn last_purge(&self) -> Result<Option<crate::PurgeRun>>;

    /// Releases `key`'s lease on an operator's request.
    ///
    /// The next delivery then retries the key at once. A live lease is released only with
    /// `force`; otherwise the answer is [`Released::LiveLease`] and nothing changes.
    ///
    /// Unlike a worker's [`DedupStore::release`], it revokes the lease. In one atomic
    /// step, the lease expires and its token is replaced. This happens only if the record
    /// still holds the lease that was read. From then on the worker that held it gets
    /// `LeaseLost` on commit, renew and release. The next claim takes the key over, with
    /// fence + 1 and attempt + 1.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when the key kept changing hands between the read and the
    /// revocation (it reads again a few times first).
    async fn release_key(&self, key: &Key, force: bool) -> Result<Released>;

    /// Removes `key`'s record on an operator's request, in one atomic step.
    ///
    /// The next delivery of the message is then processed as new. Use it for a
    /// dead-lettered message (after the fix), or a completed one that must run again.
    ///
    /// The key starts over: the next claim gets fence 1 and attempt 1. Fences restart,
    /// as after a purge: tell any downstream system that remembers fences. A record with
    /// a live lease is removed only with `force`. Without it the answer is
    /// [`Forgot::LiveLease`] and nothing changes. With it, the worker gets `LeaseLost`.
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] when the storage fails.
    ///
    /// # Examples
    ///
    /// ```
    /// use dedup_core::{Admin, ClaimOptions, DedupStore, Forgot, Key, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dedup_core::Error> {
    /// let store = MemoryStore::new();
    /// let key = Key::new("billing", "order-42")?;
    /// let lease = store.claim(&key, &ClaimOptions::default()).await?.into_lease().unwrap();
    /// store.commit(&lease, None).await?;
    ///
    /// assert!(matches!(store.forget(&key, false).await?, Forgot::Forgot { fence: 1, .. }));
    /// // The next claim starts over at fence 1.
    /// let again = store.claim(&key, &ClaimOptions::default()).await?;
    /// assert_eq!(again.lease().map(|l| l.fence), Some(1));
    /// # Ok(())
    /// # }
    /// ```
    async fn forget(&self, key: &Key, force: bool) -> Result<Forgot>;

    /// Where [`consumers`](Self::consumers) and [`stats`](Self::stats) take their counts
    /// from now. A store that cannot keep counts answers [`CountSource::Scan`] with
    /// `keepable: false`.
    async fn count_source(&self) -> Result<CountSource> {
        Ok(CountSource::Scan { keepable: false })
    }

    /// Make the store keep its records' counts by consumer and status as they change, so
    /// [`consumers`](Self::consumers) and [`stats`](Self::stats) stop reading every record.
    /// Opt-in, because every write of every consumer then pays for it (see the backend's
    /// README). The starting counts are computed from the records in the same step, under
    /// the store's migration lock, with writers held off meanwhile. `Ok(false)`: they were
    /// kept already, nothing changed. [`Error::Unsupported`] where the store cannot.
    async fn enable_counts(&self) -> Result<bool> {
        Err(Error::Unsupported("kept counts"))
    }

    /// Stop keeping counts: remove what [`enable_counts`](Self::enable_counts) added, so
    /// the store is exactly as it was without. `Ok(false)`: none were kept.
    async fn disable_counts(&self) -> Result<bool> {
        Err(Error::Unsupported("kept counts"))
    }
}
