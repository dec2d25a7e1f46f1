//! [`StoreUrl`]: a store URL parsed into the backend and the configuration it opens with.

use std::fmt;
#[cfg(feature = "sqlite")]
use std::path::PathBuf;
use std::sync::Arc;

use dedup_core::{Clock, SystemClock};

use crate::error::{OpenError, UrlError};
use crate::params::{self, ClockChoice, Params};
use crate::redact::redact;

/// A store URL, parsed and checked: which backend, and the configuration it will be
/// opened with. Parsing contacts nothing and writes nothing; [`open`](Self::open) does.
///
/// Its `Debug` and `Display` show the URL with passwords masked.
///
/// ```
/// let url = dedup::StoreUrl::parse("memory:").unwrap();
/// assert_eq!(url.backend(), "memory");
/// let bad = dedup::StoreUrl::parse("sqlite:inbox.db?tabel=x").unwrap_err();
/// assert!(bad.to_string().contains("invalid store URL"));
/// ```
#[derive(Clone)]
pub struct StoreUrl {
    shown: String,
    target: StoreTarget,
}

/// What a [`StoreUrl`] opens: the backend and its configuration (with the URL's
/// parameters applied). Variants exist for the backends this build includes. Its `Debug`
/// masks the passwords in the connection URLs.
#[derive(Clone)]
#[non_exhaustive]
pub enum StoreTarget {
    /// `memory:`: a [`MemoryStore`](dedup_core::MemoryStore), with an injected clock or
    /// the system's.
    Memory {
        /// The clock for lease arithmetic (`None`: the system clock).
        clock: Option<Arc<dyn Clock>>,
    },
    /// `sqlite:PATH` or `sqlite::memory:`.
    #[cfg(feature = "sqlite")]
    Sqlite {
        /// The database file; `None`: a private in-memory database.
        path: Option<PathBuf>,
        /// The store's configuration.
        config: dedup_sqlite::SqliteConfig,
    },
    /// `postgres://...` or `postgresql://...`.
    #[cfg(feature = "postgres")]
    Postgres {
        /// The connection URL handed to the driver (dedup's own parameters removed; it may
        /// hold a password: do not print it, use the [`StoreUrl`]'s `Display`).
        url: String,
        /// The store's configuration.
        config: dedup_postgres::PostgresConfig,
    },
    /// `mysql://...` or `mariadb://...`: MySQL or MariaDB.
    #[cfg(feature = "mysql")]
    MySql {
        /// The connection URL handed to the driver (`mysql://`, dedup's own parameters
        /// removed; it may hold a password: do not print it, use the [`StoreUrl`]'s
        /// `Display`).
        url: String,
        /// The store's configuration.
        config: dedup_mysql::MySqlConfig,
    },
    /// `redis://...` or `rediss://...`: a standalone server.
    #[cfg(feature = "redis")]
    Redis {
        /// The connection URL handed to the driver (dedup's own parameters removed).
        url: String,
        /// The store's configuration.
        config: dedup_redis::RedisConfig,
    },
    /// `redis+cluster://h1:p1,h2:p2` or `rediss+cluster://...`: a Redis Cluster.
    #[cfg(feature = "redis")]
    RedisCluster {
        /// One connection URL per seed node.
        urls: Vec<String>,
        /// The store's configuration.
        config: dedup_redis::RedisConfig,
    },
}

impl fmt::Debug for StoreTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreTarget::Memory { clock } => {
                f.debug_struct("Memory").field("clock", clock).finish()
            }
            #[cfg(feature = "sqlite")]
            StoreTarget::Sqlite { path, config } => f
                .debug_struct("Sqlite")
                .field("path", path)
                .field("config", config)
                .finish(),
            #[cfg(feature = "postgres")]
            StoreTarget::Postgres { url, config } => f
                .debug_struct("Postgres")
                .field("url", &redact(url))
                .field("config", config)
                .finish(),
            #[cfg(feature = "mysql")]
            StoreTarget::MySql { url, config } => f
                .debug_struct("MySql")
                .field("url", &redact(url))
                .field("config", config)
                .finish(),
            #[cfg(feature = "redis")]
            StoreTarget::Redis { url, config } => f
                .debug_struct("Redis")
                .field("url", &redact(url))
                .field("config", config)
                .finish(),
            #[cfg(feature = "redis")]
            StoreTarget::RedisCluster { urls, config } => f
                .debug_struct("RedisCluster")
                .field("urls", &urls.iter().map(|u| redact(u)).collect::<Vec<_>>())
                .field("config", config)
                .finish(),
        }
    }
}

impl StoreUrl {
    /// Parse and check `url`. See the crate docs for the forms and their parameters.
    pub fn parse(url: &str) -> Result<Self, OpenError> {
        let shown = redact(url);
        match target(url) {
            Ok(target) => Ok(StoreUrl { shown, target }),
            Err(problem) => Err(OpenError::Url {
                url: shown,
                problem,
            }),
        }
    }

    /// [`parse`](Self::parse) `url` with some of its parameters replaced (or added): each
    /// `(name, value)` in `overrides` takes the place of the URL's own `name=` parameter, and
    /// is checked exactly like one written in the URL (a parameter the backend does not take
    /// is [`UrlError::UnknownParameter`]). For tools whose flags override a URL, such as the
    /// `dedup` command line's `--table`, `--schema` and `--prefix`.
    pub fn parse_with(url: &str, overrides: &[(&str, &str)]) -> Result<Self, OpenError> {
        if overrides.is_empty() {
            return Self::parse(url);
        }
        let (base, query) = match url.split_once('?') {
            Some((base, query)) => (base, query),
            None => (url, ""),
        };
        let mut out = form_urlencoded::Serializer::new(String::new());
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            if !overrides.iter().any(|(o, _)| *o == name) {
                out.append_pair(&name, &value);
            }
        }
        for (name, value) in overrides {
            out.append_pair(name, value);
        }
        Self::parse(&format!("{base}?{}", out.finish()))
    }

    /// Where this store keeps its records, for people: `FILE, table T` (SQLite), `table
    /// SCHEMA.T` (PostgreSQL), `table T` (MySQL), `key prefix P` (Redis), `this process's
    /// memory`.
    pub fn location(&self) -> String {
        match &self.target {
            StoreTarget::Memory { .. } => "this process's memory (empty)".to_owned(),
            #[cfg(feature = "sqlite")]
            StoreTarget::Sqlite { path, config } => {
                let file = path
                    .as_ref()
                    .map_or(":memory:".into(), |p| p.display().to_string());
                format!("{file}, table {}", config.table)
            }
            #[cfg(feature = "postgres")]
            StoreTarget::Postgres { config, .. } => {
                format!("table {}.{}", config.schema, config.table)
            }
            #[cfg(feature = "mysql")]
            StoreTarget::MySql { config, .. } => format!("table {}", config.table),
            #[cfg(feature = "redis")]
            StoreTarget::Redis { config, .. } | StoreTarget::RedisCluster { config, .. } => {
                format!("key prefix {}", config.prefix)
            }
        }
    }

    /// The database file, for stores kept in one (SQLite); `None` otherwise.
    pub fn file(&self) -> Option<&std::path::Path> {
        match &self.target {
            #[cfg(feature = "sqlite")]
            StoreTarget::Sqlite { path, .. } => path.as_deref(),
            _ => None,
        }
    }

    /// The backend's name: `memory`, `sqlite`, `postgres`, `mysql`, `redis` or
    /// `redis-cluster`.
    pub fn backend(&self) -> &'static str {
        match &self.target {
            StoreTarget::Memory { .. } => "memory",
            #[cfg(feature = "sqlite")]
            StoreTarget::Sqlite { .. } => "sqlite",
            #[cfg(feature = "postgres")]
            StoreTarget::Postgres { .. } => "postgres",
            #[cfg(feature = "mysql")]
            StoreTarget::MySql { .. } => "mysql",
            #[cfg(feature = "redis")]
            StoreTarget::Redis { .. } => "redis",
            #[cfg(feature = "redis")]
            StoreTarget::RedisCluster { .. } => "redis-cluster",
        }
    }

    /// The backend and configuration this URL opens.
    pub fn target(&self) -> &StoreTarget {
        &self.target
    }

    /// The backend and configuration, to adjust before opening them yourself.
    pub fn into_target(self) -> StoreTarget {
        self.target
    }

    /// Use `clock` for lease arithmetic instead of the URL's (`clock=`) or the backend's
    /// default (simulations and tests control expiry this way).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        let slot = match &mut self.target {
            StoreTarget::Memory { clock } => clock,
            #[cfg(feature = "sqlite")]
            StoreTarget::Sqlite { config, .. } => &mut config.clock,
            #[cfg(feature = "postgres")]
            StoreTarget::Postgres { config, .. } => &mut config.clock,
            #[cfg(feature = "mysql")]
            StoreTarget::MySql { config, .. } => &mut config.clock,
            #[cfg(feature = "redis")]
            StoreTarget::Redis { config, .. } | StoreTarget::RedisCluster { config, .. } => {
                &mut config.clock
            }
        };
        *slot = Some(clock);
        self
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreUrl")
            .field("url", &self.shown)
            .field("backend", &self.backend())
            .finish_non_exhaustive()
    }
}

/// The URL's scheme, in lower case, and what follows its `:`.
fn target(url: &str) -> Result<StoreTarget, UrlError> {
    let Some((scheme, rest)) = url.split_once(':') else {
        return Err(malformed(
            "no scheme: start with memory:, sqlite:, postgres://, mysql://, redis:// or \
             redis+cluster://",
        ));
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    match scheme.to_ascii_lowercase().as_str() {
        "memory" => memory(rest, query),
        "sqlite" => sqlite(rest, query),
        "postgres" | "postgresql" => postgres(scheme, rest, query),
        "mysql" | "mariadb" => mysql(rest, query),
        "redis" | "rediss" => redis(scheme, rest, query),
        "redis+cluster" | "rediss+cluster" => redis_cluster(scheme, rest, query),
        _ => Err(UrlError::UnknownScheme {
            scheme: scheme.to_owned(),
        }),
    }
}

fn malformed(reason: impl Into<String>) -> UrlError {
    UrlError::Malformed {
        reason: reason.into(),
    }
}

fn disabled(what: &'static str, feature: &'static str) -> UrlError {
    UrlError::Disabled { what, feature }
}

/// A local clock for `clock=local`; `clock=server` is refused where there is no server.
fn local_clock(params: &mut Params, backend: &str) -> Result<Option<Arc<dyn Clock>>, UrlError> {
    match params.take_with("clock", params::clock)? {
        None | Some(ClockChoice::Local) => Ok(None),
        Some(ClockChoice::Server) => Err(params::invalid(
            "clock",
            "server",
            &format!("{backend} has no server clock; leases use this machine's clock"),
        )),
    }
}

/// `clock=server` (the default: `None`) or `clock=local` (this machine's).
fn server_or_local_clock(params: &mut Params) -> Result<Option<Arc<dyn Clock>>, UrlError> {
    Ok(match params.take_with("clock", params::clock)? {
        None | Some(ClockChoice::Server) => None,
        Some(ClockChoice::Local) => Some(Arc::new(SystemClock)),
    })
}

fn memory(rest: &str, query: Option<&str>) -> Result<StoreTarget, UrlError> {
    if !matches!(rest, "" | "//") {
        return Err(malformed("memory: takes no path"));
    }
    let mut params = Params::parse(query, "memory", &["clock"])?;
    let clock = local_clock(&mut params, "memory")?;
    Ok(StoreTarget::Memory { clock })
}

/// Parameters of `sqlite:` URLs.
const SQLITE_PARAMS: &[&str] = &[
    "table",
    "synchronous",
    "pool_size",
    "busy_timeout",
    "block_in_place",
    "clock",
    "migrate",
];

#[cfg(feature = "sqlite")]
fn sqlite(rest: &str, query: Option<&str>) -> Result<StoreTarget, UrlError> {
    use dedup_sqlite::{SqliteConfig, Synchronous};
    let path = rest.strip_prefix("//").unwrap_or(rest);
    let path = match path {
        "" => {
            return Err(malformed(
                "sqlite: needs a file path (sqlite:inbox.db, sqlite:/var/lib/app/inbox.db) \
                 or sqlite::memory:",
            ));
        }
        ":memory:" => None,
        p => Some(PathBuf::from(p)),
    };
    let mut params = Params::parse(query, "sqlite", SQLITE_PARAMS)?;
    let mut config = SqliteConfig {
        clock: local_clock(&mut params, "sqlite")?,
        ..SqliteConfig::default()
    };
    if let Some(table) = params.take("table") {
        config.table = table;
    }
    if let Some(sync) =
        params.take_with("synchronous", |v| match v.to_ascii_lowercase().as_str() {
            "full" => Ok(Synchronous::Full),
            "normal" => Ok(Synchronous::Normal),
            _ => Err("expected full or normal".to_owned()),
        })?
    {
        config.synchronous = sync;
    }
    if let Some(n) = params.take_with("pool_size", params::count)? {
        config.pool_size = n as usize;
    }
    if let Some(t) = params.take_with("busy_timeout", params::duration)? {
        config.busy_timeout = t;
    }
    if let Some(in_place) = params.take_with("block_in_place", params::boolean)? {
        config.block_in_place = in_place;
    }
    if let Some(migrate) = params.take_with("migrate", params::boolean)? {
        config.migrate = migrate;
    }
    config.validate().map_err(UrlError::Config)?;
    Ok(StoreTarget::Sqlite { path, config })
}

#[cfg(not(feature = "sqlite"))]
fn sqlite(_: &str, _: Option<&str>) -> Result<StoreTarget, UrlError> {
    Err(disabled("sqlite backend", "sqlite"))
}

/// Parameters of `postgres://` URLs: dedup's own, then the driver's (passed through).
const POSTGRES_PARAMS: &[&str] = &[
    "schema",
    "table",
    "pool_size",
    "clock",
    "connect_timeout",
    "migrate",
    "group_commit",
    "group_commit_rounds",
    "group_commit_max",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "application_name",
    "options",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "statement-cache-capacity",
];

/// `scheme://rest`, checked as a URL with a host (the driver parses it again).
#[cfg(any(feature = "postgres", feature = "redis", feature = "mysql"))]
fn server_url(scheme: &str, rest: &str, what: &str) -> Result<String, UrlError> {
    if !rest.starts_with("//") {
        return Err(malformed(format!("{what} URLs start with {scheme}://")));
    }
    let base = format!("{scheme}:{rest}");
    url::Url::parse(&base).map_err(|e| malformed(format!("not a valid {what} URL: {e}")))?;
    Ok(base)
}

/// `base` with the query `rest` appended.
fn with_query(base: String, rest: Option<String>) -> String {
    match rest {
        Some(q) => format!("{base}?{q}"),
        None => base,
    }
}

#[cfg(feature = "postgres")]
fn postgres(scheme: &str, rest: &str, query: Option<&str>) -> Result<StoreTarget, UrlError> {
    use dedup_postgres::PostgresConfig;
    let base = server_url(scheme, rest, "PostgreSQL")?;
    let mut params = Params::parse(query, "postgres", POSTGRES_PARAMS)?;
    let mut config = PostgresConfig {
        clock: server_or_local_clock(&mut params)?,
        ..PostgresConfig::default()
    };
    if let Some(schema) = params.take("schema") {
        config.schema = schema;
    }
    if let Some(table) = params.take("table") {
        config.table = table;
    }
    if let Some(n) = params.take_with("pool_size", params::count)? {
        config.max_connections = n;
    }
    if let Some(t) = params.take_with("connect_timeout", params::duration)? {
        config.connect_timeout = t;
    }
    if let Some(migrate) = params.take_with("migrate", params::boolean)? {
        config.migrate = migrate;
    }
    config.group_commit = group_commit(&mut params)?;
    let sslmode = params.take("sslmode");
    if let Some(mode) = &sslmode {
        let tls = match mode.as_str() {
            "disable" | "allow" | "prefer" => false,
            "require" | "verify-ca" | "verify-full" => true,
            _ => {
                return Err(params::invalid(
                    "sslmode",
                    mode,
                    "expected disable, allow, prefer, require, verify-ca or verify-full",
                ));
            }
        };
        if tls && !cfg!(feature = "tls") {
            return Err(disabled("TLS", "tls"));
        }
    }
    config.validate().map_err(UrlError::Config)?;
    let mut driver = params.rest();
    if let Some(mode) = sslmode {
        let pair = format!("sslmode={mode}");
        driver = Some(match driver {
            Some(q) => format!("{q}&{pair}"),
            None => pair,
        });
    }
    Ok(StoreTarget::Postgres {
        url: with_query(base, driver),
        config,
    })
}

/// `group_commit=on|off`, `group_commit_rounds=N`, `group_commit_max=N` (either bound
/// alone turns it on; with `off` they are refused as contradictory).
#[cfg(feature = "postgres")]
fn group_commit(params: &mut Params) -> Result<Option<dedup_postgres::GroupCommit>, UrlError> {
    let on = params.take_with("group_commit", params::on_off)?;
    let rounds = params.take_with("group_commit_rounds", params::count)?;
    let max = params.take_with("group_commit_max", params::count)?;
    if on == Some(false) && (rounds.is_some() || max.is_some()) {
        return Err(params::invalid(
            "group_commit",
            "off",
            "group_commit_rounds / group_commit_max need group commit on",
        ));
    }
    if on == Some(false) {
        return Ok(None);
    }
    let mut group = dedup_postgres::GroupCommit::default();
    if let Some(n) = rounds {
        group.rounds = n as usize;
    }
    if let Some(n) = max {
        group.max_requests = n as usize;
    }
    Ok(Some(group))
}

#[cfg(not(feature = "postgres"))]
fn postgres(_: &str, _: &str, _: Option<&str>) -> Result<StoreTarget, UrlError> {
    Err(disabled("postgres backend", "postgres"))
}

/// Parameters of `mysql://` and `mariadb://` URLs: dedup's own, then the driver's (passed
/// through).
const MYSQL_PARAMS: &[&str] = &[
    "table",
    "pool_size",
    "clock",
    "connect_timeout",
    "migrate",
    "ssl-mode",
    "sslmode",
    "ssl-ca",
    "sslca",
    "ssl-cert",
    "sslcert",
    "ssl-key",
    "sslkey",
    "charset",
    "collation",
    "statement-cache-capacity",
    "socket",
    "timezone",
    "time-zone",
];

/// `mysql://` or `mariadb://` (the driver is given `mysql://`).
#[cfg(feature = "mysql")]
fn mysql(rest: &str, query: Option<&str>) -> Result<StoreTarget, UrlError> {
    use dedup_mysql::MySqlConfig;
    let base = server_url("mysql", rest, "MySQL")?;
    let mut params = Params::parse(query, "mysql", MYSQL_PARAMS)?;
    let mut config = MySqlConfig {
        clock: server_or_local_clock(&mut params)?,
        ..MySqlConfig::default()
    };
    if let Some(table) = params.take("table") {
        config.table = table;
    }
    if let Some(n) = params.take_with("pool_size", params::count)? {
        config.max_connections = n;
    }
    if let Some(t) = params.take_with("connect_timeout", params::duration)? {
        config.connect_timeout = t;
    }
    if let Some(migrate) = params.take_with("migrate", params::boolean)? {
        config.migrate = migrate;
    }
    let mut ssl_mode = None;
    for name in ["ssl-mode", "sslmode"] {
        if let Some(mode) = params.take(name) {
            let tls = match mode.to_ascii_uppercase().as_str() {
                "DISABLED" | "PREFERRED" => false,
                "REQUIRED" | "VERIFY_CA" | "VERIFY_IDENTITY" => true,
                _ => {
                    return Err(params::invalid(
                        name,
                        &mode,
                        "expected DISABLED, PREFERRED, REQUIRED, VERIFY_CA or VERIFY_IDENTITY",
                    ));
                }
            };
            if tls && !cfg!(feature = "tls") {
                return Err(disabled("TLS", "tls"));
            }
            ssl_mode = Some(mode);
        }
    }
    config.validate().map_err(UrlError::Config)?;
    let mut driver = params.rest();
    if let Some(mode) = ssl_mode {
        let pair = format!("ssl-mode={mode}");
        driver = Some(match driver {
            Some(q) => format!("{q}&{pair}"),
            None => pair,
        });
    }
    Ok(StoreTarget::MySql {
        url: with_query(base, driver),
        config,
    })
}

#[cfg(not(feature = "mysql"))]
fn mysql(_: &str, _: Option<&str>) -> Result<StoreTarget, UrlError> {
    Err(disabled("mysql backend", "mysql"))
}

/// Parameters of `redis://` and `redis+cluster://` URLs (`protocol` is the driver's).
const REDIS_PARAMS: &[&str] = &[
    "prefix",
    "retention",
    "clock",
    "connect_timeout",
    "response_timeout",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "protocol",
];

/// The [`RedisConfig`](dedup_redis::RedisConfig) of a Redis URL's parameters; what is left
/// is the driver's.
#[cfg(feature = "redis")]
fn redis_config(params: &mut Params, tls: bool) -> Result<dedup_redis::RedisConfig, UrlError> {
    use dedup_redis::RedisConfig;
    let mut config = RedisConfig {
        clock: server_or_local_clock(params)?,
        ..RedisConfig::default()
    };
    if let Some(prefix) = params.take("prefix") {
        config.prefix = prefix;
    }
    if let Some(t) = params.take_with("retention", params::duration)? {
        config.retention = t;
    }
    if let Some(t) = params.take_with("connect_timeout", params::duration)? {
        config.connect_timeout = t;
    }
    if let Some(t) = params.take_with("response_timeout", params::duration)? {
        config.response_timeout = Some(t);
    }
    config.tls.ca = params.take("tls_ca").map(Into::into);
    config.tls.client_cert = params.take("tls_cert").map(Into::into);
    config.tls.client_key = params.take("tls_key").map(Into::into);
    if (tls || !config.tls.is_empty()) && !cfg!(feature = "tls") {
        return Err(disabled("TLS", "tls"));
    }
    if !tls && !config.tls.is_empty() {
        return Err(malformed(
            "tls_ca, tls_cert and tls_key need a TLS URL: rediss:// or rediss+cluster://",
        ));
    }
    config.validate().map_err(UrlError::Config)?;
    Ok(config)
}

#[cfg(feature = "redis")]
fn redis(scheme: &str, rest: &str, query: Option<&str>) -> Result<StoreTarget, UrlError> {
    let base = server_url(scheme, rest, "Redis")?;
    let mut params = Params::parse(query, "redis", REDIS_PARAMS)?;
    let config = redis_config(&mut params, scheme.eq_ignore_ascii_case("rediss"))?;
    Ok(StoreTarget::Redis {
        url: with_query(base, params.rest()),
        config,
    })
}

/// The `redis+cluster://host:port,host:port` store URL of a Redis Cluster whose nodes are
/// listed as comma-separated `redis://host:port/` URLs, the form `scripts/services.sh`
/// prints in `DEDUP_REDIS_CLUSTER_URLS` (spaces around the commas and empty entries are
/// ignored).
pub fn redis_cluster_url(node_urls: &str) -> String {
    let nodes: Vec<&str> = node_urls
        .split(',')
        .map(|n| {
            n.trim()
                .trim_start_matches("redis://")
                .trim_end_matches('/')
        })
        .filter(|n| !n.is_empty())
        .collect();
    format!("redis+cluster://{}", nodes.join(","))
}

#[cfg(feature = "redis")]
fn redis_cluster(scheme: &str, rest: &str, query: Option<&str>) -> Result<StoreTarget, UrlError> {
    let tls = scheme.to_ascii_lowercase().starts_with("rediss");
    let node_scheme = if tls { "rediss" } else { "redis" };
    let Some(nodes) = rest.strip_prefix("//") else {
        return Err(malformed(format!("cluster URLs start with {scheme}://")));
    };
    let mut params = Params::parse(query, "redis-cluster", REDIS_PARAMS)?;
    let config = redis_config(&mut params, tls)?;
    let driver = params.rest();
    let mut urls = Vec::new();
    for node in nodes.split(',') {
        let node = node.trim_end_matches('/');
        if node.is_empty() {
            return Err(malformed(
                "empty cluster node: list them as host:port,host:port",
            ));
        }
        let base = server_url(node_scheme, &format!("//{node}"), "Redis Cluster node")?;
        urls.push(with_query(base, driver.clone()));
    }
    Ok(StoreTarget::RedisCluster { urls, config })
}

#[cfg(not(feature = "redis"))]
fn redis(_: &str, _: &str, _: Option<&str>) -> Result<StoreTarget, UrlError> {
    Err(disabled("redis backend", "redis"))
}

#[cfg(not(feature = "redis"))]
fn redis_cluster(_: &str, _: &str, _: Option<&str>) -> Result<StoreTarget, UrlError> {
    Err(disabled("redis backend", "redis"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_urls_become_one_cluster_url() {
        assert_eq!(
            redis_cluster_url("redis://127.0.0.1:7000/, redis://127.0.0.1:7001/,,"),
            "redis+cluster://127.0.0.1:7000,127.0.0.1:7001"
        );
    }
}
