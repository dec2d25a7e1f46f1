//! [`OutboxTable`]: what a [`PostgresStore`](crate::PostgresStore) keeps about its outbox
//! table (names, statements, whether it is known current, when it last notified), built
//! with the store and shared by its clones.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dedup_sql::outbox::OutboxTableState;

use crate::config::PostgresConfig;
use crate::outbox_statements::{OutboxStatements, shared};

/// At most one `NOTIFY` per this interval per store (see
/// [`PostgresOutboxDialect`](crate::PostgresOutboxDialect)'s `enqueue`).
pub const NOTIFY_EVERY: Duration = Duration::from_millis(10);

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
        }
    }

    /// Whether this enqueue should notify: none was sent in the last [`NOTIFY_EVERY`].
    pub(crate) fn take_notify_turn(&self) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64 + NOTIFY_EVERY.as_millis() as u64;
        let last = self.last_notify_ms.load(Ordering::Relaxed);
        now >= last + NOTIFY_EVERY.as_millis() as u64
            && self
                .last_notify_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}
