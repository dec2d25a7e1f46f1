//! [`MemoryOutbox`]: the reference model of [`OutboxStore`](super::OutboxStore), in process.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use super::{
    AfterFailure, DestinationStats, DestinationTally, Held, OutboxEntry, OutboxMessage,
    OutboxQuery, OutboxRow, OutboxState, OutboxStats,
};
use crate::backend::OutboxStorage;
use crate::{Clock, LeaseToken, PurgeOptions, PurgeReport, Result, SystemClock, Timestamp};

/// The outbox in memory, with the contract of [`OutboxStore`](super::OutboxStore) written
/// out plainly (an [`OutboxStorage`], behind the same front door as the SQL outboxes): what
/// the SQL backends are tested against, and an outbox for tests. Producers write through
/// [`begin`](Self::begin) (a transaction: commit or roll back) or
/// [`enqueue`](Self::enqueue) (one committed transaction).
///
/// Like a database sequence, a transaction takes its row ids when it enqueues, not when it
/// commits: a transaction that commits late adds rows with ids smaller than rows already
/// published, as on PostgreSQL.
#[derive(Clone, Debug)]
pub struct MemoryOutbox {
    inner: Arc<Mutex<Inner>>,
    clock: Arc<dyn Clock>,
}

#[derive(Debug, Default)]
struct Inner {
    next_id: i64,
    rows: BTreeMap<i64, Stored>,
}

#[derive(Clone, Debug)]
struct Stored {
    row: OutboxRow,
    state: OutboxState,
    due_at: Timestamp,
    sent_at: Option<Timestamp>,
    last_error: Option<String>,
    holder: Option<(LeaseToken, Timestamp)>,
}

/// A producer's open transaction on a [`MemoryOutbox`]: its rows appear on
/// [`commit`](Self::commit) and never when it is dropped or rolled back.
#[derive(Debug)]
pub struct MemoryOutboxTx {
    outbox: MemoryOutbox,
    rows: Vec<(i64, OutboxMessage)>,
}

impl Default for MemoryOutbox {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryOutbox {
    /// An empty outbox on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An empty outbox on `clock` (a [`ManualClock`](crate::ManualClock) in tests).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryOutbox {
            inner: Arc::default(),
            clock,
        }
    }

    /// Open a transaction.
    pub fn begin(&self) -> MemoryOutboxTx {
        MemoryOutboxTx {
            outbox: self.clone(),
            rows: Vec::new(),
        }
    }

    /// Enqueue `messages` in one transaction of their own, committed.
    pub fn enqueue(&self, messages: &[OutboxMessage]) -> Result<()> {
        let mut tx = self.begin();
        tx.enqueue(messages)?;
        tx.commit();
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }
}

impl MemoryOutboxTx {
    /// Add `messages` to this transaction (ids are taken now).
    pub fn enqueue(&mut self, messages: &[OutboxMessage]) -> Result<()> {
        let mut inner = self.outbox.lock();
        for m in messages {
            inner.next_id += 1;
            self.rows.push((inner.next_id, m.clone()));
        }
        Ok(())
    }

    /// Commit: the rows become visible, each message id at most once in the table.
    pub fn commit(self) {
        let now = self.outbox.now();
        let mut inner = self.outbox.lock();
        for (id, m) in self.rows {
            if inner
                .rows
                .values()
                .any(|s| s.row.message_id == m.message_id())
            {
                continue;
            }
            inner.rows.insert(
                id,
                Stored {
                    row: OutboxRow {
                        id,
                        destination: m.destination().to_owned(),
                        message_id: m.message_id().to_owned(),
                        headers: m.headers().to_vec(),
                        payload: m.payload().to_vec(),
                        ordering_key: m.ordering_key_str().map(str::to_owned),
                        written_at: now,
                        attempts: 0,
                    },
                    state: OutboxState::Pending,
                    due_at: now.saturating_add(m.delay()),
                    sent_at: None,
                    last_error: None,
                    holder: None,
                },
            );
        }
    }

    /// Roll back: nothing of this transaction is written.
    pub fn rollback(self) {}
}

impl Stored {
    fn live_hold(&self, now: Timestamp) -> Option<&LeaseToken> {
        match (&self.state, &self.holder) {
            (OutboxState::Held, Some((token, until))) if *until > now => Some(token),
            _ => None,
        }
    }

    fn takeable(&self, now: Timestamp) -> bool {
        match self.state {
            OutboxState::Pending => self.due_at <= now,
            OutboxState::Held => self.live_hold(now).is_none(),
            OutboxState::Sent | OutboxState::Dead => false,
        }
    }

    fn held_by(&self, token: &LeaseToken, now: Timestamp) -> bool {
        self.live_hold(now) == Some(token)
    }
}

#[async_trait]
impl OutboxStorage for MemoryOutbox {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn take(&self, limit: usize, hold: Duration) -> Result<Held> {
        let now = self.now();
        let until = now.saturating_add(hold);
        let token = LeaseToken::random();
        let mut inner = self.lock();
        // Keys with an earlier row that is pending or held (taken or not in this call).
        let mut blocked = std::collections::HashSet::new();
        let mut candidates: Vec<(Timestamp, i64)> = Vec::new();
        for (id, s) in &inner.rows {
            let earlier_blocks = s
                .row
                .ordering_key
                .as_ref()
                .is_some_and(|k| blocked.contains(k));
            if let Some(k) = &s.row.ordering_key
                && matches!(s.state, OutboxState::Pending | OutboxState::Held)
            {
                blocked.insert(k.clone());
            }
            if !earlier_blocks && s.takeable(now) {
                candidates.push((s.due_at, *id));
            }
        }
        candidates.sort();
        let mut rows = Vec::new();
        for (_, id) in candidates.into_iter().take(limit) {
            let s = inner.rows.get_mut(&id).expect("candidate exists");
            s.state = OutboxState::Held;
            s.holder = Some((token, until));
            s.row.attempts += 1;
            rows.push(s.row.clone());
        }
        Ok(Held { token, until, rows })
    }

    async fn mark_sent(&self, token: &LeaseToken, ids: &[i64]) -> Result<Vec<i64>> {
        let now = self.now();
        let mut inner = self.lock();
        let mut marked = Vec::new();
        for id in ids {
            if let Some(s) = inner.rows.get_mut(id)
                && s.held_by(token, now)
            {
                s.state = OutboxState::Sent;
                s.sent_at = Some(now);
                s.holder = None;
                marked.push(*id);
            }
        }
        Ok(marked)
    }

    async fn mark_failed(
        &self,
        token: &LeaseToken,
        id: i64,
        error: &str,
        after: AfterFailure,
    ) -> Result<bool> {
        let now = self.now();
        let mut inner = self.lock();
        let Some(s) = inner.rows.get_mut(&id).filter(|s| s.held_by(token, now)) else {
            return Ok(false);
        };
        s.holder = None;
        s.last_error = Some(error.to_owned());
        match after {
            AfterFailure::RetryAfter(delay) => {
                s.state = OutboxState::Pending;
                s.due_at = now.saturating_add(delay);
            }
            AfterFailure::Dead => s.state = OutboxState::Dead,
        }
        Ok(true)
    }

    async fn hand_back(&self, token: &LeaseToken, ids: &[i64]) -> Result<u64> {
        let now = self.now();
        let mut inner = self.lock();
        let mut n = 0;
        for id in ids {
            if let Some(s) = inner.rows.get_mut(id)
                && s.held_by(token, now)
            {
                s.state = OutboxState::Pending;
                s.holder = None;
                s.due_at = now;
                s.row.attempts = s.row.attempts.saturating_sub(1);
                n += 1;
            }
        }
        Ok(n)
    }

    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        let cutoff = self.now().saturating_sub(options.retention);
        let mut inner = self.lock();
        let before = inner.rows.len();
        inner.rows.retain(|_, s| {
            !(s.state == OutboxState::Sent && s.sent_at.is_some_and(|t| t <= cutoff))
        });
        Ok(PurgeReport {
            completed: (before - inner.rows.len()) as u64,
            batches: 1,
            ..PurgeReport::default()
        })
    }

    async fn stats(&self) -> Result<OutboxStats> {
        let now = self.now();
        let inner = self.lock();
        let mut stats = OutboxStats {
            now,
            ..OutboxStats::default()
        };
        for s in inner.rows.values() {
            match s.state {
                OutboxState::Pending => stats.pending += 1,
                OutboxState::Held => stats.held += 1,
                OutboxState::Sent => stats.sent += 1,
                OutboxState::Dead => stats.dead += 1,
            }
            if matches!(s.state, OutboxState::Pending | OutboxState::Held) {
                let w = s.row.written_at;
                stats.oldest_unsent = Some(stats.oldest_unsent.map_or(w, |o| o.min(w)));
            }
        }
        Ok(stats)
    }

    async fn stats_by_destination(&self) -> Result<Vec<DestinationStats>> {
        let mut tally = DestinationTally::at(self.now());
        for s in self.lock().rows.values() {
            let destination = &s.row.destination;
            tally.add(
                "memory",
                destination,
                s.state.as_str(),
                1,
                Some(s.row.written_at),
            )?;
        }
        Ok(tally.finish())
    }

    async fn list(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>> {
        let limit = query.limit;
        let inner = self.lock();
        Ok(inner
            .rows
            .values()
            .filter(|s| query.after_id.is_none_or(|a| s.row.id > a))
            .filter(|s| query.state.is_none_or(|st| s.state == st))
            .filter(|s| {
                query
                    .destination
                    .as_deref()
                    .is_none_or(|d| s.row.destination == d)
            })
            .take(limit)
            .map(|s| OutboxEntry {
                row: s.row.clone(),
                state: s.state,
                due_at: s.due_at,
                sent_at: s.sent_at,
                last_error: s.last_error.clone(),
            })
            .collect())
    }

    async fn retry(&self, id: i64) -> Result<bool> {
        let now = self.now();
        let mut inner = self.lock();
        match inner.rows.get_mut(&id) {
            Some(s) if matches!(s.state, OutboxState::Dead | OutboxState::Pending) => {
                s.state = OutboxState::Pending;
                s.due_at = now;
                s.row.attempts = 0;
                Ok(true)
            }
            Some(_) | None => Ok(false),
        }
    }
}
