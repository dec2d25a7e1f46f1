//! [`PostgresConfig`]: where the records live and which clock leases use.

use std::sync::Arc;

use dedup_core::names::sql_identifier;
use dedup_core::{Clock, Result};

/// How a [`PostgresStore`](crate::PostgresStore) is set up.
///
/// Build it with struct-update syntax so new fields keep your code compiling:
///
/// ```
/// use dedup_postgres::PostgresConfig;
/// let config = PostgresConfig { table: "billing_inbox".into(), ..Default::default() };
/// assert_eq!(config.schema, "public");
/// ```
#[derive(Clone, Debug)]
pub struct PostgresConfig {
    /// The schema holding the table (created by [`migrate`](crate::PostgresStore::migrate)
    /// when missing). Default `public`. ASCII letters, digits and `_`, at most 63 bytes.
    pub schema: String,
    /// The table holding the records. Default `dedup_inbox`. Same rules as `schema`.
    pub table: String,
    /// The clock for lease arithmetic. `None` (the default): the PostgreSQL server's clock
    /// (`clock_timestamp()`), so nodes with skewed clocks agree. Inject one (a
    /// [`ManualClock`](dedup_core::ManualClock)) to control expiry in tests.
    pub clock: Option<Arc<dyn Clock>>,
    /// Pool size used by [`PostgresStore::connect`](crate::PostgresStore::connect) and
    /// [`connect_with`](crate::PostgresStore::connect_with) (ignored by `from_pool`).
    /// Default 10. See the crate docs on sizing: lease mode needs about one connection per
    /// concurrent store call; transactional mode one per message being handled.
    pub max_connections: u32,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            schema: "public".into(),
            table: "dedup_inbox".into(),
            clock: None,
            max_connections: 10,
        }
    }
}

impl PostgresConfig {
    /// Check the schema and table names (they are spliced into SQL, quoted).
    pub fn validate(&self) -> Result<()> {
        sql_identifier("schema", &self.schema)?;
        sql_identifier("table", &self.table)
    }

    /// `"schema"."table"`, ready to splice into SQL (call [`validate`](Self::validate) first).
    pub(crate) fn qualified_table(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.table)
    }
}
