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
    dedup_sql::connect::pool::<Backend>(options(url, config)?, settings).await
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
