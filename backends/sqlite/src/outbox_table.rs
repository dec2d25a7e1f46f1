//! [`OutboxTable`]: what a [`SqliteStore`](crate::SqliteStore) keeps about its outbox
//! table (its name, its statements, whether its schema is known current), built with the
//! store and shared by its clones.

use std::sync::atomic::{AtomicBool, Ordering};

use dedup_core::Result;
use rusqlite::Connection;

use crate::outbox_schema;
use crate::outbox_statements::OutboxStatements;

/// The outbox's table as the store knows it: its name, its statements, and whether its
/// schema is known to be current.
pub(crate) struct OutboxTable {
    pub(crate) table: String,
    pub(crate) sql: OutboxStatements,
    /// Set once the table was migrated (at open) or checked (on first use, for a store
    /// opened without migrating).
    ready: AtomicBool,
}

impl OutboxTable {
    pub(crate) fn new(table: String, migrated: bool) -> Self {
        OutboxTable {
            sql: OutboxStatements::new(&table),
            table,
            ready: AtomicBool::new(migrated),
        }
    }

    /// For a store opened without migrating: check the outbox table's version once, before
    /// its first use ([`Error::SchemaNotMigrated`] until `dedup migrate` ran).
    pub(crate) fn ensure(&self, conn: &Connection) -> Result<()> {
        if self.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        outbox_schema::check(conn, &self.table)?;
        self.ready.store(true, Ordering::Release);
        Ok(())
    }
}
