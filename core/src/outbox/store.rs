//! [`OutboxStore`]: what a relay needs from the table the producers write to.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;

use crate::{LeaseToken, PurgeOptions, PurgeReport, Result, Timestamp};

/// Longest error text kept with a row ([`OutboxEntry::last_error`]); longer texts are cut
/// at a character boundary.
pub const MAX_ERROR_LEN: usize = 2000;

/// Where a row is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutboxState {
    /// Waiting to be published (when due).
    Pending,
    /// Taken by a relay, until its hold runs out.
    Held,
    /// Published and confirmed by the broker.
    Sent,
    /// Failed [`RelayConfig::max_attempts`](super::RelayConfig::max_attempts) times; kept
    /// for an operator (`dedup outbox retry`).
    Dead,
}

impl OutboxState {
    /// The name stored in the table and shown by the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            OutboxState::Pending => "pending",
            OutboxState::Held => "held",
            OutboxState::Sent => "sent",
            OutboxState::Dead => "dead",
        }
    }

    /// Parse [`as_str`](Self::as_str)'s form.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => OutboxState::Pending,
            "held" => OutboxState::Held,
            "sent" => OutboxState::Sent,
            "dead" => OutboxState::Dead,
            _ => return None,
        })
    }
}

impl fmt::Display for OutboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One message as the relay publishes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxRow {
    /// The row's id in the table (increasing in insertion order; not a commit order).
    pub id: i64,
    /// Where it goes.
    pub destination: String,
    /// Its stable id: publishers set it as the broker's message id.
    pub message_id: String,
    /// Its headers.
    pub headers: Vec<(String, String)>,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Its ordering key.
    pub ordering_key: Option<String>,
    /// When its transaction wrote it, by the store's clock.
    pub written_at: Timestamp,
    /// Publish attempts so far, this one included (a take counts one).
    pub attempts: u32,
}

/// Rows a relay took: publish them, then [`mark_sent`](OutboxStore::mark_sent),
/// [`mark_failed`](OutboxStore::mark_failed) or [`hand_back`](OutboxStore::hand_back) each
/// with `token` before `until`.
#[derive(Clone, Debug)]
pub struct Held {
    /// The token that fences every later call on these rows.
    pub token: LeaseToken,
    /// When the hold runs out by the store's clock; after that another relay may take the
    /// rows (and publish them again).
    pub until: Timestamp,
    /// The rows, by due time then id; at most one per ordering key.
    pub rows: Vec<OutboxRow>,
}

/// What happens to a row whose publish failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterFailure {
    /// Back to pending, due again after this delay.
    RetryAfter(Duration),
    /// Dead: kept, never taken again until an operator retries it.
    Dead,
}

/// Counts of rows by state, and the age of the oldest pending one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutboxStats {
    /// Rows waiting (due or not).
    pub pending: u64,
    /// Rows held by a relay.
    pub held: u64,
    /// Published rows not yet purged.
    pub sent: u64,
    /// Dead rows.
    pub dead: u64,
    /// When the oldest pending or held row was written.
    pub oldest_unsent: Option<Timestamp>,
    /// The store's clock when the counts were taken.
    pub now: Timestamp,
}

impl OutboxStats {
    /// Add `rows` rows in the stored state `state` (oldest written at `oldest`), as a
    /// store's statistics query answers them one state per row (or a store reading rows one
    /// by one, one at a time); a pending or held row's time feeds
    /// [`oldest_unsent`](Self::oldest_unsent). A state this build does not know
    /// is a non-retryable [`Error::Backend`](crate::Error::Backend) of `backend`.
    pub fn count_state(
        &mut self,
        backend: &'static str,
        state: &str,
        rows: u64,
        oldest: Option<Timestamp>,
    ) -> Result<()> {
        let unsent = match OutboxState::parse(state) {
            Some(OutboxState::Pending) => {
                self.pending += rows;
                true
            }
            Some(OutboxState::Held) => {
                self.held += rows;
                true
            }
            Some(OutboxState::Sent) => {
                self.sent += rows;
                false
            }
            Some(OutboxState::Dead) => {
                self.dead += rows;
                false
            }
            None => {
                return Err(crate::Error::backend(
                    backend,
                    false,
                    format!("outbox rows in an unknown state {state:?}"),
                ));
            }
        };
        if let (true, Some(w)) = (unsent, oldest) {
            self.oldest_unsent = Some(self.oldest_unsent.map_or(w, |o| o.min(w)));
        }
        Ok(())
    }

    /// How long the oldest unsent row has waited (zero when none waits).
    pub fn oldest_unsent_age(&self) -> Duration {
        self.oldest_unsent
            .map(|t| self.now.since(t))
            .unwrap_or_default()
    }
}

/// One destination's rows by state and its lag (see
/// [`OutboxStore::stats_by_destination`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DestinationStats {
    /// The destination, as the producers wrote it.
    pub destination: String,
    /// Its rows by state; [`OutboxStats::oldest_unsent_age`] is its lag (how long its
    /// oldest pending or held row has waited).
    pub stats: OutboxStats,
}

/// Per-destination counts built from a statistics query's rows (one per destination and
/// state) or from rows read one by one, in destination order.
#[derive(Debug)]
pub struct DestinationTally {
    now: Timestamp,
    by_destination: std::collections::BTreeMap<String, OutboxStats>,
}

impl DestinationTally {
    /// No rows counted yet; the store's clock read `now`.
    pub fn at(now: Timestamp) -> Self {
        DestinationTally {
            now,
            by_destination: std::collections::BTreeMap::new(),
        }
    }

    /// Add `rows` rows of `destination` in the stored state `state` (see
    /// [`OutboxStats::count_state`], which refuses an unknown state as an error of
    /// `backend`).
    pub fn add(
        &mut self,
        backend: &'static str,
        destination: &str,
        state: &str,
        rows: u64,
        oldest: Option<Timestamp>,
    ) -> Result<()> {
        if !self.by_destination.contains_key(destination) {
            let empty = OutboxStats {
                now: self.now,
                ..OutboxStats::default()
            };
            self.by_destination.insert(destination.to_owned(), empty);
        }
        let stats = self
            .by_destination
            .get_mut(destination)
            .expect("inserted above");
        stats.count_state(backend, state, rows, oldest)
    }

    /// The counts, in destination order.
    pub fn finish(self) -> Vec<DestinationStats> {
        self.by_destination
            .into_iter()
            .map(|(destination, stats)| DestinationStats { destination, stats })
            .collect()
    }
}

/// One row as an operator sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxEntry {
    /// The row.
    pub row: OutboxRow,
    /// Its state.
    pub state: OutboxState,
    /// When it is (or was) due.
    pub due_at: Timestamp,
    /// When it was published.
    pub sent_at: Option<Timestamp>,
    /// The last publish error, cut to [`MAX_ERROR_LEN`].
    pub last_error: Option<String>,
}

/// Which rows [`OutboxStore::list`] returns, by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutboxQuery {
    /// Only rows in this state.
    pub state: Option<OutboxState>,
    /// Only rows for this destination.
    pub destination: Option<String>,
    /// Only rows with an id greater than this (for paging).
    pub after_id: Option<i64>,
    /// At most this many rows (0: 100).
    pub limit: usize,
}

/// The outbox table as a relay and an operator use it.
///
/// Producers write to it with their backend's `enqueue`, inside their own transaction.
/// Everything after the commit goes through this trait. Most services only hand it to a
/// [`Relay`](super::Relay). `dedup::open_outbox` opens one from a URL.
///
/// # Examples
///
/// What a relay does, by hand:
///
/// ```
/// use std::time::Duration;
/// use dedup_core::outbox::{MemoryOutbox, OutboxMessage, OutboxStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dedup_core::Error> {
/// let outbox = MemoryOutbox::new();
/// outbox.enqueue(&[OutboxMessage::new("invoices", "invoice-1", b"{}".to_vec())?])?;
///
/// let held = outbox.take(10, Duration::from_secs(30)).await?;
/// assert_eq!(held.rows.len(), 1);
/// // ... publish the rows ...
/// let ids: Vec<i64> = held.rows.iter().map(|row| row.id).collect();
/// let sent = outbox.mark_sent(&held.token, &ids).await?;
/// assert_eq!(sent, ids);
/// assert_eq!(outbox.stats().await?.sent, 1);
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// Every method can fail with [`Error::Backend`](crate::Error::Backend) when the storage
/// fails, and with [`Error::InvalidInput`](crate::Error::InvalidInput) for input out of
/// range (a zero limit or hold, too many ids). A mark refused because the hold ran out is
/// not an error: the method answers what it changed.
///
/// # Cancel safety
///
/// Each method is atomic. A dropped [`take`](Self::take) may have held rows: they are
/// taken again once the hold runs out. A dropped mark may or may not have marked.
///
/// # Contract
///
/// - **Only committed rows exist.** A row written in a transaction that rolled back is
///   never returned by anything here.
/// - **A message id is kept once.** Enqueueing an id that is already in the table (in any
///   state, until purged) writes nothing.
/// - **No two live holds on one row.** [`take`](Self::take) returns due pending rows, and
///   held rows whose hold ran out, under a fresh token; a row is in at most one live hold.
///   It counts one attempt on each row it takes.
/// - **Due rows are found by state and due time**, never by a position in the id sequence,
///   so a row whose transaction committed after rows with greater ids is still taken.
/// - **Order per ordering key.** A row with an ordering key is not taken while a row of the
///   same key with a smaller id is pending or held; a take returns at most one row per key.
///   Dead rows do not block their key. Rows of different keys never wait for each other.
/// - **Fenced marks.** [`mark_sent`](Self::mark_sent), [`mark_failed`](Self::mark_failed)
///   and [`hand_back`](Self::hand_back) change a row only while `token` holds it; a relay
///   whose hold was taken over changes nothing (its publish is the at-least-once
///   re-publish the downstream inbox absorbs).
/// - **Sent rows are purged** by [`purge`](Self::purge) once sent longer ago than
///   `options.retention`; pending, held and dead rows never are.
#[async_trait]
pub trait OutboxStore: Send + Sync + fmt::Debug {
    /// The backend's name (`sqlite`, `postgres`, `memory`), for metrics and messages.
    fn backend(&self) -> &'static str;

    /// Take at most `limit` due rows for `hold` (see the contract). An empty
    /// [`Held::rows`] when nothing is due.
    async fn take(&self, limit: usize, hold: Duration) -> Result<Held>;

    /// Mark `ids` sent, where `token` still holds them. Returns the ids it marked.
    async fn mark_sent(&self, token: &LeaseToken, ids: &[i64]) -> Result<Vec<i64>>;

    /// Record a failed publish of `id` (the error text cut to [`MAX_ERROR_LEN`]) and
    /// return the row to pending or make it dead, where `token` still holds it. Returns
    /// whether it did.
    async fn mark_failed(
        &self,
        token: &LeaseToken,
        id: i64,
        error: &str,
        after: AfterFailure,
    ) -> Result<bool>;

    /// Return `ids` to pending, due now, without counting their attempt (a relay stopping
    /// before it published them). Returns how many it returned.
    async fn hand_back(&self, token: &LeaseToken, ids: &[i64]) -> Result<u64>;

    /// Remove sent rows older than `options.retention`, in batches paced as `options.pace`
    /// says. Counts them as `completed` in the report.
    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport>;

    /// Rows by state, over the whole table.
    async fn stats(&self) -> Result<OutboxStats>;

    /// Rows by state per destination, each with its lag (the age of its oldest pending or
    /// held row), in destination order, as of one reading of the store's clock: one entry
    /// per destination that has rows in any state. Their counts add up to
    /// [`stats`](Self::stats)'s. One aggregate query grouped by destination and state on
    /// the SQL backends; like [`stats`](Self::stats) it reads every row of the table (sent
    /// rows until they are purged), a maintenance read, not a hot-path one.
    async fn stats_by_destination(&self) -> Result<Vec<DestinationStats>>;

    /// Rows matching `query`, by id.
    async fn list(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>>;

    /// Make a dead (or pending) row pending, due now, with its attempts back to zero. Returns
    /// whether a row was changed (`false`: no such row, or it is held or sent).
    async fn retry(&self, id: i64) -> Result<bool>;

    /// A stream that yields `Ok(())` when rows may have become due (PostgreSQL `NOTIFY`),
    /// or `None` when the store has no such signal. Only a hint: a relay polls as well. An
    /// `Err` item says the signal was lost (the stream may end after it); a relay then
    /// calls `wakeups` again, with backoff, until it answers.
    async fn wakeups(&self) -> Result<Option<BoxStream<'static, Result<()>>>> {
        Ok(None)
    }
}

/// Cut `error` to [`MAX_ERROR_LEN`] bytes at a character boundary.
pub fn cut_error(error: &str) -> &str {
    if error.len() <= MAX_ERROR_LEN {
        return error;
    }
    let mut end = MAX_ERROR_LEN;
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    &error[..end]
}
