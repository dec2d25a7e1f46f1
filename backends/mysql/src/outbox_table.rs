//! [`OutboxTable`]: what a [`MySqlStore`](crate::MySqlStore) keeps about its outbox
//! tables (their names, their statements, whether they are known current), built with the
//! store and shared by its clones.

use tokio::sync::OnceCell;

use crate::config::MySqlConfig;
use crate::outbox_schema::keys_table_name;
use crate::outbox_statements::OutboxStatements;

/// The outbox's tables as the store knows them.
pub(crate) struct OutboxTable {
    /// `` `table` ``.
    pub(crate) quoted: String,
    pub(crate) sql: OutboxStatements,
    /// Set once the tables are known to be current (migrated, or checked on first use).
    pub(crate) ready: OnceCell<()>,
}

impl OutboxTable {
    /// The outbox of `config` (validated).
    pub(crate) fn new(config: &MySqlConfig) -> Self {
        let name = config.outbox_table_name();
        let quoted = format!("`{name}`");
        let keys = format!("`{}`", keys_table_name(&name));
        OutboxTable {
            sql: OutboxStatements::new(&quoted, &keys),
            quoted,
            ready: OnceCell::new(),
        }
    }

    /// The tables were just migrated: no check needed.
    pub(crate) fn migrated(&self) {
        let _ = self.ready.set(());
    }
}
