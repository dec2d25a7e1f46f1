//! [`OutboxTable`]: what a [`PostgresStore`](crate::PostgresStore) keeps about its outbox
//! table (names, statements, whether it is known current, when it last notified, the
//! producers whose notification it skipped), built with the store and shared by its
//! clones.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dedup_sql::outbox::OutboxTableState;

use crate::config::PostgresConfig;
use crate::outbox_statements::{OutboxStatements, shared};

/// At most one `NOTIFY` per this interval per store from the producers' own transactions
/// (see [`PostgresOutboxDialect`](crate::PostgresOutboxDialect)'s `enqueue`). A producer
/// whose notification was skipped gets a trailing one once its transaction has committed.
///
/// 5 ms: the relay is woken at least that often while producers write, which keeps the
/// commit-to-publish p99 near 10 ms at 1 000 msgs/s (at 10 ms the wait for the next
/// notification alone was up to 10 ms). Notifying commits still run at most about one per
/// window, so producers rarely queue behind each other's commit.
pub const NOTIFY_EVERY: Duration = Duration::from_millis(5);

/// The first wait between two looks at skipped producers' transactions still open; it
/// doubles up to [`TRAILING_MOST`].
pub(crate) const TRAILING_FIRST: Duration = Duration::from_millis(5);

/// The longest wait between two looks at skipped producers' transactions still open.
pub(crate) const TRAILING_MOST: Duration = Duration::from_millis(50);

/// Skipped producers' transactions kept at most; beyond, the oldest are dropped (the
/// relay's poll still finds their rows).
const SKIPPED_MOST: usize = 10_000;

/// The outbox's table as the store knows it.
pub(crate) struct OutboxTable {
    /// `"schema"."table"`, and whether it is known current (migrated, or checked on first
    /// use).
    pub(crate) table: OutboxTableState,
    /// The `NOTIFY` channel: `schema.table` when that fits PostgreSQL's 63 bytes, else the
    /// table's name.
    pub(crate) channel: String,
    pub(crate) sql: OutboxStatements,
    /// When this store last sent a `NOTIFY` (ms since `epoch`), for [`NOTIFY_EVERY`].
    last_notify_ms: AtomicU64,
    epoch: Instant,
    /// The transactions that wrote rows without notifying, waiting for their trailing
    /// notification.
    skipped: Mutex<Skipped>,
}

/// See [`OutboxTable::skipped`].
#[derive(Default)]
struct Skipped {
    /// Their ids (`txid_current()`).
    xacts: Vec<i64>,
    /// Whether a task sends their trailing notification.
    scheduled: bool,
}

impl OutboxTable {
    pub(crate) fn new(config: &PostgresConfig) -> Self {
        let name = config.outbox_table_name();
        let qualified = config.qualified_outbox_table();
        let full = format!("{}.{name}", config.schema);
        OutboxTable {
            sql: OutboxStatements::new(&qualified),
            channel: if full.len() <= 63 { full } else { name },
            table: OutboxTableState::new(qualified.clone(), shared(&qualified)),
            last_notify_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            skipped: Mutex::default(),
        }
    }

    /// Now, in ms since `epoch`, offset by [`NOTIFY_EVERY`] so that the first turn is free.
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + NOTIFY_EVERY.as_millis() as u64
    }

    /// Whether this enqueue should notify: none was sent in the last [`NOTIFY_EVERY`].
    pub(crate) fn take_notify_turn(&self) -> bool {
        let now = self.now_ms();
        let last = self.last_notify_ms.load(Ordering::Relaxed);
        now >= last + NOTIFY_EVERY.as_millis() as u64
            && self
                .last_notify_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// How long until the end of the current [`NOTIFY_EVERY`] window.
    pub(crate) fn until_window_ends(&self) -> Duration {
        let end = self.last_notify_ms.load(Ordering::Relaxed) + NOTIFY_EVERY.as_millis() as u64;
        Duration::from_millis(end.saturating_sub(self.now_ms()))
    }

    /// Transaction `xact` wrote rows without notifying. True when no task sends trailing
    /// notifications yet: the caller starts one (and [`settle`](Self::settle) ends it).
    pub(crate) fn skipped(&self, xact: i64) -> bool {
        let mut skipped = self.skipped.lock().unwrap_or_else(|p| p.into_inner());
        if skipped.xacts.len() >= SKIPPED_MOST {
            skipped.xacts.remove(0);
        }
        skipped.xacts.push(xact);
        !std::mem::replace(&mut skipped.scheduled, true)
    }

    /// The skipped transactions to look at.
    pub(crate) fn skipped_xacts(&self) -> Vec<i64> {
        let skipped = self.skipped.lock().unwrap_or_else(|p| p.into_inner());
        skipped.xacts.clone()
    }

    /// After a look at `looked` (those still `open` are kept): whether any is left to look
    /// at. When none is, the task ends (the next skip starts another).
    pub(crate) fn settle(&self, looked: &[i64], open: &[i64]) -> bool {
        let looked: HashSet<i64> = looked.iter().copied().collect();
        let open: HashSet<i64> = open.iter().copied().collect();
        let mut skipped = self.skipped.lock().unwrap_or_else(|p| p.into_inner());
        skipped
            .xacts
            .retain(|x| !looked.contains(x) || open.contains(x));
        skipped.scheduled = !skipped.xacts.is_empty();
        skipped.scheduled
    }

    /// The task sending trailing notifications ended without [`settle`](Self::settle)
    /// (its runtime shut down): forget the transactions, so the next skip starts another.
    pub(crate) fn abandon(&self) {
        let mut skipped = self.skipped.lock().unwrap_or_else(|p| p.into_inner());
        skipped.xacts.clear();
        skipped.scheduled = false;
    }
}
