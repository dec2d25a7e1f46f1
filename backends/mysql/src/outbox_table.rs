//! [`OutboxTable`]: what a [`MySqlStore`](crate::MySqlStore) keeps about its outbox
//! tables (their names, their statements, whether they are known current), built with the
//! store and shared by its clones.

use dedup_sql::outbox::OutboxTableState;

use crate::config::MySqlConfig;
use crate::config::keys_table_name;
use crate::outbox_statements::{OutboxStatements, shared};

/// The outbox's tables as the store knows them.
pub(crate) struct OutboxTable {
    /// `` `table` ``, and whether the tables are known current (migrated, or checked on
    /// first use).
    pub(crate) table: OutboxTableState,
    pub(crate) sql: OutboxStatements,
}

impl OutboxTable {
    /// The outbox of `config` (validated).
    pub(crate) fn new(config: &MySqlConfig) -> Self {
        let name = config.outbox_table_name();
        let quoted = format!("`{name}`");
        let keys = format!("`{}`", keys_table_name(&name));
        OutboxTable {
            sql: OutboxStatements::new(&quoted, &keys),
            table: OutboxTableState::new(quoted.clone(), shared(&quoted)),
        }
    }
}
