//! [`PostgresConfig`]: where the records live and which clock leases use.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::backend::names::sql_identifier;
use dedup_core::{Clock, Error, Result, TlsFiles};

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
    /// How long [`connect`](crate::PostgresStore::connect) may take to establish its first
    /// connection (TCP, TLS and authentication) before it fails with the cause. Default 5 s.
    pub connect_timeout: Duration,
    /// TLS certificate files, applied on top of the URL's own `sslrootcert`, `sslcert`,
    /// `sslkey`. A CA given here with no `sslmode` in the URL means `sslmode=verify-full`.
    /// TLS needs this crate's `tls` feature.
    pub tls: TlsFiles,
    /// Whether [`connect`](crate::PostgresStore::connect) /
    /// [`connect_with`](crate::PostgresStore::connect_with) create or upgrade the table
    /// ([`migrate`](crate::PostgresStore::migrate)). Default `true`. With `false` they only
    /// check it, writing nothing (a role without the right to create tables can open the
    /// store): a missing or older table is [`Error::SchemaNotMigrated`], a newer one
    /// [`Error::SchemaTooNew`]. For read-only tools such as `dedup stats`.
    pub migrate: bool,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            schema: "public".into(),
            table: "dedup_inbox".into(),
            clock: None,
            max_connections: 10,
            connect_timeout: Duration::from_secs(5),
            tls: TlsFiles::default(),
            migrate: true,
        }
    }
}

impl PostgresConfig {
    /// Check the schema and table names (they are spliced into SQL, quoted), the connect
    /// timeout and the TLS files.
    pub fn validate(&self) -> Result<()> {
        sql_identifier("schema", &self.schema)?;
        sql_identifier("table", &self.table)?;
        if self.connect_timeout.is_zero() {
            return Err(Error::invalid("connect_timeout", "must not be zero"));
        }
        self.tls.validate()
    }

    /// `"schema"."table"`, ready to splice into SQL (call [`validate`](Self::validate) first).
    pub(crate) fn qualified_table(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.table)
    }
}
