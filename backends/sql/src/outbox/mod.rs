//! The transactional outbox over an [`OutboxDialect`]: [`SqlOutbox`] enqueues in the
//! caller's sqlx transaction and gives the outbox's storage
//! ([`OutboxStorage`](dedup_core::backend::OutboxStorage), which the outbox's front door
//! turns into [`OutboxStore`](dedup_core::outbox::OutboxStore)): takes under holds with per-key
//! order and poison isolation, marks sent / failed / dead, purges sent rows, and the
//! operator's reads. The dialect supplies its statements, its row decoding and its
//! wake-ups; the logic around them is here, once.

mod dialect;
mod row;
mod storage;

use std::fmt;

use dedup_core::Result;
use dedup_core::outbox::OutboxMessage;

use crate::error::SqlBackend;

pub use dialect::{
    Conn, Db, FailedPublish, OutboxDialect, OutboxTableState, RowFilter, SharedStatements, Taken,
};
pub use row::{
    ROW_COLUMNS, StateCount, StateCounts, decode_headers, decode_row, decode_state_counts,
    sql_limit,
};

/// A transactional outbox table over dialect `D` (see the [module](self) docs). Cheap to
/// clone when `D` is.
#[derive(Clone)]
pub struct SqlOutbox<D> {
    dialect: D,
}

impl<D: OutboxDialect> fmt::Debug for SqlOutbox<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlOutbox")
            .field("table", &self.table())
            .field("dialect", &self.dialect)
            .finish()
    }
}

impl<D: OutboxDialect> SqlOutbox<D> {
    /// The outbox over `dialect`.
    pub fn new(dialect: D) -> Self {
        SqlOutbox { dialect }
    }

    /// The dialect (its table, and what else the backend exposes on it).
    pub fn dialect(&self) -> &D {
        &self.dialect
    }

    /// The outbox table, quoted.
    pub fn table(&self) -> &str {
        self.dialect.table().name()
    }

    /// For a store that did not migrate: check the outbox table once before its first use.
    pub(crate) async fn ensure(&self) -> Result<()> {
        let check = || async {
            let mut conn = self
                .dialect
                .pool()
                .acquire()
                .await
                .map_err(D::Backend::error)?;
            self.dialect.check_table(&mut conn).await
        };
        self.dialect
            .table()
            .ready()
            .get_or_try_init(check)
            .await
            .map(|_| ())
    }

    /// Write `messages` to the outbox inside the caller's transaction (`&mut *tx`), next
    /// to its business rows: relays see them when it commits, and never if it rolls back.
    /// Returns how many rows were new: a message whose id is already in the outbox (in any
    /// state, until purged) writes nothing. Each message is due after its delay from the
    /// store's "now".
    ///
    /// **Ordering keys.** Row ids are given when a row is inserted, but rows become visible
    /// when their transaction commits; two transactions writing the same key could commit
    /// in the other order than their ids, and a relay, which publishes a key's rows by id
    /// and a row only once no earlier row of its key is pending, could then publish the
    /// later row first (the earlier was not yet visible). So the dialect's insert first
    /// locks each ordering key (in sorted order) until the caller's transaction ends: a
    /// second transaction writing the same key waits until the first commits or rolls
    /// back, and per key, id order is commit order. Keep such transactions short; messages
    /// without a key take no lock. How each backend locks is in its dialect's docs.
    pub async fn enqueue(&self, conn: &mut Conn<D>, messages: &[OutboxMessage]) -> Result<u64> {
        if messages.is_empty() {
            return Ok(0);
        }
        self.ensure().await?;
        let headers = row::encode_headers(messages, D::Backend::NAME)?;
        self.dialect.insert(conn, messages, &headers).await
    }
}
