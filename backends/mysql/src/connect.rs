//! Connecting, MySQL's part: the URL's options with the configured TLS files, and the
//! hints for the error numbers a MySQL / MariaDB server answers. The first connection
//! within the connect timeout, the pool options and the hints every server shares are
//! [`dedup_sql::connect`]'s.

use std::str::FromStr;

use dedup_core::Result;
use dedup_sql::connect::{ConnectDialect, PoolSettings};
use sqlx::MySqlPool;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions, MySqlSslMode};

pub use dedup_sql::connect::PING_IF_IDLE_FOR;

use crate::config::MySqlConfig;
use crate::error::{Backend, error_number};

/// The pool for `url` with `config`, after one connection was made and closed again.
pub(crate) async fn pool(url: &str, config: &MySqlConfig) -> Result<MySqlPool> {
    let settings = PoolSettings {
        max_connections: config.max_connections,
        acquire_timeout: config.acquire_timeout,
        connect_timeout: config.connect_timeout,
    };
    let pool = dedup_sql::connect::pool::<Backend>(options(url, config)?, settings).await?;
    check_galera(&pool).await?;
    Ok(pool)
}

/// A Galera node's `wsrep_sync_wait` lacks bit 1 (reads) or bit 2 (updates and deletes).
/// Then a read may miss writes the cluster committed through other nodes, and an update
/// may match no row that another node already changed: a claim, a relay's mark or a
/// hand-back could answer from a stale record.
/// [`MySqlStore::connect_with`](crate::MySqlStore::connect_with) refuses such a node with
/// this as the source of a non-retryable [`Error::Backend`](dedup_core::Error::Backend).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GaleraSyncWait {
    /// The node's `wsrep_sync_wait`.
    pub found: u32,
}

impl std::fmt::Display for GaleraSyncWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "this Galera node has wsrep_sync_wait = {}, so its reads and updates may miss \
             writes made through other nodes: set wsrep_sync_wait = 3 (reads, updates and \
             deletes wait for the cluster; 7 adds inserts) in the server's configuration",
            self.found
        )
    }
}

impl std::error::Error for GaleraSyncWait {}

/// Refuse a Galera node (`wsrep_on`) whose reads, updates and deletes do not wait for the
/// cluster (`wsrep_sync_wait` without bits 1 and 2); any other server passes. One
/// statement.
async fn check_galera(pool: &MySqlPool) -> Result<()> {
    let rows: Vec<(String, String)> =
        sqlx::query_as("SHOW VARIABLES WHERE Variable_name IN ('wsrep_on', 'wsrep_sync_wait')")
            .fetch_all(pool)
            .await
            .map_err(crate::error::backend)?;
    let value = |name: &str| {
        rows.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let sync_wait = value("wsrep_sync_wait").and_then(|v| v.parse().ok());
    galera_settings(value("wsrep_on"), sync_wait)
        .map_err(|e| dedup_core::Error::backend(crate::error::BACKEND, false, e))
}

/// The decision of [`check_galera`]: `wsrep_on` as the server shows it (`None`: not a
/// Galera build), and its `wsrep_sync_wait`.
fn galera_settings(
    wsrep_on: Option<&str>,
    sync_wait: Option<u32>,
) -> std::result::Result<(), GaleraSyncWait> {
    match (wsrep_on, sync_wait) {
        (Some(on), Some(found)) if on.eq_ignore_ascii_case("on") && found & 3 != 3 => {
            Err(GaleraSyncWait { found })
        }
        _ => Ok(()),
    }
}

/// The pool options [`MySqlStore::connect_with`](crate::MySqlStore::connect_with) uses:
/// `config.max_connections`, and a ping before handing out a connection only when it sat
/// idle longer than [`PING_IF_IDLE_FOR`] (sqlx's default pings at every checkout: one more
/// round trip per store call).
pub fn pool_options(config: &MySqlConfig) -> MySqlPoolOptions {
    dedup_sql::connect::pool_options(config.max_connections, config.acquire_timeout)
}

/// The URL's options with `config.tls` applied.
fn options(url: &str, config: &MySqlConfig) -> Result<MySqlConnectOptions> {
    let mut options =
        MySqlConnectOptions::from_str(url).map_err(dedup_sql::connect::invalid_url::<Backend>)?;
    let tls = &config.tls;
    if let Some(ca) = &tls.ca {
        options = options.ssl_ca(ca);
        if matches!(options.get_ssl_mode(), MySqlSslMode::Preferred) {
            options = options.ssl_mode(MySqlSslMode::VerifyIdentity);
        }
    }
    if let (Some(cert), Some(key)) = (&tls.client_cert, &tls.client_key) {
        options = options.ssl_client_cert(cert).ssl_client_key(key);
    }
    Ok(options)
}

/// What the server answers when connecting goes wrong.
impl ConnectDialect for Backend {
    const SERVER: &'static str = "MySQL / MariaDB";
    const CA_PARAMETER: &'static str = "ssl-ca";

    fn target(options: &MySqlConnectOptions) -> String {
        match options.get_socket() {
            Some(socket) => socket.display().to_string(),
            None => format!("{}:{}", options.get_host(), options.get_port()),
        }
    }

    fn host(options: &MySqlConnectOptions) -> String {
        options.get_host().to_owned()
    }

    fn server_hint(e: &sqlx::Error, options: &MySqlConnectOptions, _: &str) -> Option<String> {
        let user = options.get_username();
        let database = options.get_database().unwrap_or_default();
        match error_number(e)? {
            1045 => Some(format!(
                "access denied for user {user:?}: check the user and password in the URL"
            )),
            1044 => Some(format!(
                "the user {user:?} may not use the database {database:?}: grant it"
            )),
            1049 => Some(format!(
                "the database {database:?} does not exist: create it (CREATE DATABASE) or fix \
                 the URL"
            )),
            1040 => Some("the server has no free connection slots".to_owned()),
            3159 => Some(
                "the server accepts only TLS connections: add ssl-mode=VERIFY_IDENTITY and \
                 ssl-ca=CA-FILE to the URL"
                    .to_owned(),
            ),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_galera_node_must_wait_for_the_cluster_before_reads_and_updates() {
        assert_eq!(
            galera_settings(Some("ON"), Some(0)),
            Err(GaleraSyncWait { found: 0 })
        );
        assert_eq!(
            galera_settings(Some("ON"), Some(6)),
            Err(GaleraSyncWait { found: 6 })
        );
        assert_eq!(
            galera_settings(Some("ON"), Some(1)),
            Err(GaleraSyncWait { found: 1 })
        );
        assert_eq!(galera_settings(Some("ON"), Some(3)), Ok(()));
        assert_eq!(galera_settings(Some("ON"), Some(15)), Ok(()));
        // Not a cluster member, or not a Galera build: nothing to wait for.
        assert_eq!(galera_settings(Some("OFF"), Some(0)), Ok(()));
        assert_eq!(galera_settings(None, None), Ok(()));
        let said = GaleraSyncWait { found: 0 }.to_string();
        assert!(said.contains("wsrep_sync_wait = 3"), "{said}");
    }
}
