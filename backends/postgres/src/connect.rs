//! Connecting, PostgreSQL's part: the URL's options with the configured TLS files, and the
//! hints for what only a PostgreSQL server answers. The first connection within the
//! connect timeout, the pool options and the hints every server shares are
//! [`dedup_sql::connect`]'s.

use std::str::FromStr;

use dedup_core::Result;
use dedup_sql::connect::{ConnectDialect, PoolSettings};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};

pub use dedup_sql::connect::PING_IF_IDLE_FOR;

use crate::config::PostgresConfig;
use crate::error::{Backend, cut_during_tls_negotiation};

/// The pool for `url` with `config`, after one connection was made and closed again.
pub(crate) async fn pool(url: &str, config: &PostgresConfig) -> Result<PgPool> {
    let settings = PoolSettings {
        max_connections: config.max_connections,
        acquire_timeout: config.acquire_timeout,
        connect_timeout: config.connect_timeout,
    };
    dedup_sql::connect::pool::<Backend>(options(url, config)?, settings).await
}

/// The pool options [`PostgresStore::connect_with`](crate::PostgresStore::connect_with) uses:
/// `config.max_connections`, `config.acquire_timeout`, and a ping before handing out a
/// connection only when it sat idle longer than [`PING_IF_IDLE_FOR`].
///
/// sqlx's default pings every connection at every checkout: one extra round trip per store
/// call, which on a busy server costs about as much as the statement's own. A connection that broke while in
/// use (a server restart) fails its statement with a retryable error and is then dropped;
/// one that sat idle is checked first, as before. Build a pool with these options to share
/// it with [`from_pool`](crate::PostgresStore::from_pool) and get the same behaviour.
pub fn pool_options(config: &PostgresConfig) -> PgPoolOptions {
    dedup_sql::connect::pool_options(config.max_connections, config.acquire_timeout)
}

/// The URL's options with `config.tls` applied.
fn options(url: &str, config: &PostgresConfig) -> Result<PgConnectOptions> {
    let mut options =
        PgConnectOptions::from_str(url).map_err(dedup_sql::connect::invalid_url::<Backend>)?;
    let tls = &config.tls;
    if let Some(ca) = &tls.ca {
        options = options.ssl_root_cert(ca);
        if matches!(options.get_ssl_mode(), PgSslMode::Prefer) {
            options = options.ssl_mode(PgSslMode::VerifyFull);
        }
    }
    if let (Some(cert), Some(key)) = (&tls.client_cert, &tls.client_key) {
        options = options.ssl_client_cert(cert).ssl_client_key(key);
    }
    Ok(options)
}

/// What the server answers when connecting goes wrong.
impl ConnectDialect for Backend {
    const SERVER: &'static str = "PostgreSQL";
    const CA_PARAMETER: &'static str = "sslrootcert";

    fn target(options: &PgConnectOptions) -> String {
        match options.get_socket() {
            Some(socket) => socket.display().to_string(),
            None => format!("{}:{}", options.get_host(), options.get_port()),
        }
    }

    fn host(options: &PgConnectOptions) -> String {
        options.get_host().to_owned()
    }

    fn server_hint(e: &sqlx::Error, options: &PgConnectOptions, target: &str) -> Option<String> {
        let user = options.get_username();
        let database = options.get_database().unwrap_or(user);
        match e {
            sqlx::Error::Tls(tls) if tls.to_string().contains("does not support TLS") => {
                Some(format!(
                    "{target} does not accept TLS connections: use sslmode=prefer or disable \
                     in the URL, or enable ssl on the server"
                ))
            }
            sqlx::Error::Protocol(message) if cut_during_tls_negotiation(message) => Some(format!(
                "{target} closed the connection before answering the TLS request: the server \
                 may be restarting or out of connections, or something in between dropped it; \
                 retry"
            )),
            sqlx::Error::Protocol(message) if message.contains("SSLRequest") => Some(format!(
                "{target} answered the TLS request as no PostgreSQL server does: is it a \
                 PostgreSQL port?"
            )),
            sqlx::Error::Database(db) => {
                let message = db.message();
                match db.code().as_deref() {
                    Some("28000") if message.contains("no encryption") => Some(
                        "the server accepts only TLS connections: add sslmode=verify-full and \
                         sslrootcert=CA-FILE to the URL"
                            .to_owned(),
                    ),
                    Some("28000") if message.contains("pg_hba.conf") => Some(format!(
                        "the server's pg_hba.conf has no entry for role {user:?} and database \
                         {database:?} from this host"
                    )),
                    Some("28000") => Some(format!(
                        "the role {user:?} does not exist or may not log in: check the user \
                         in the URL"
                    )),
                    Some("28P01") => Some(format!(
                        "password authentication failed for role {user:?}: check the password"
                    )),
                    Some("3D000") => Some(format!(
                        "the database {database:?} does not exist: create it (createdb) or fix \
                         the URL"
                    )),
                    Some("53300") => Some("the server has no free connection slots".to_owned()),
                    _ => None,
                }
            }
            _ => None,
        }
    }
}
