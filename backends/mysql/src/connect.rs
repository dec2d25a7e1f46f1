//! Connecting: the first connection made eagerly within the connect timeout, so a wrong
//! address, user, password, database or TLS setting surfaces at once with its cause and a
//! hint, instead of as a pool timeout later.

use std::str::FromStr;
use std::time::Duration;

use dedup_core::{Error, Result, TimedOut};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions, MySqlSslMode};
use sqlx::{ConnectOptions, Connection, MySqlPool};

use crate::config::MySqlConfig;
use crate::error::{BACKEND, backend, error_number};

/// What the errors below say was being done.
const CONNECTING: &str = "connecting";

/// The pool for `url` with `config`, after one connection was made and closed again.
pub(crate) async fn pool(url: &str, config: &MySqlConfig) -> Result<MySqlPool> {
    let options = options(url, config)?;
    let target = target(&options);
    let first = tokio::time::timeout(config.connect_timeout, options.connect()).await;
    match first {
        Ok(Ok(conn)) => {
            // Best effort: the server may drop it first, which is fine.
            let _ = conn.close().await;
        }
        Ok(Err(e)) => return Err(connect_error(e, &options, &target)),
        Err(_) => {
            let timed_out = TimedOut {
                what: format!("connecting to {target}"),
                after: config.connect_timeout,
            };
            return Err(Error::backend(BACKEND, true, timed_out)
                .during(CONNECTING)
                .with_hint(format!(
                    "no answer from {target}: is the host reachable, and is it a MySQL / \
                     MariaDB port? (connect timeout {:?})",
                    config.connect_timeout
                )));
        }
    }
    Ok(pool_options(config).connect_lazy_with(options))
}

/// Connections idle longer than this are pinged before use; busier ones are not.
pub const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// The pool options [`MySqlStore::connect_with`](crate::MySqlStore::connect_with) uses:
/// `config.max_connections`, and a ping before handing out a connection only when it sat
/// idle longer than [`PING_IF_IDLE_FOR`] (sqlx's default pings at every checkout: one more
/// round trip per store call).
pub fn pool_options(config: &MySqlConfig) -> MySqlPoolOptions {
    MySqlPoolOptions::new()
        .max_connections(config.max_connections.max(1))
        .acquire_timeout(config.acquire_timeout)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for > PING_IF_IDLE_FOR {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
}

/// The URL's options with `config.tls` applied.
fn options(url: &str, config: &MySqlConfig) -> Result<MySqlConnectOptions> {
    let mut options = MySqlConnectOptions::from_str(url).map_err(|e| {
        backend(e)
            .during(CONNECTING)
            .with_hint("the connection URL is not valid")
    })?;
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

/// `host:port`, or the socket path: where the store connects (never the password).
fn target(options: &MySqlConnectOptions) -> String {
    match options.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    }
}

/// `e` from the first connection as [`Error::Backend`] with a hint for the usual mistakes.
fn connect_error(e: sqlx::Error, options: &MySqlConnectOptions, target: &str) -> Error {
    let hint = hint(&e, options, target);
    let error = backend(e).during(CONNECTING);
    match hint {
        Some(h) => error.with_hint(h),
        None => error,
    }
}

fn hint(e: &sqlx::Error, options: &MySqlConnectOptions, target: &str) -> Option<String> {
    let user = options.get_username();
    let database = options.get_database().unwrap_or_default();
    match e {
        sqlx::Error::Io(io) => Some(match io.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                format!("nothing listens at {target}: is the server running, on that port?")
            }
            _ if io.to_string().contains("lookup") => format!(
                "the host {} could not be resolved: check the host name",
                options.get_host()
            ),
            _ if io.to_string().contains("certificate") => tls_hint(target),
            _ => format!("the connection to {target} failed"),
        }),
        sqlx::Error::Tls(_) => Some(tls_hint(target)),
        sqlx::Error::Database(_) => match error_number(e) {
            Some(1045) => Some(format!(
                "access denied for user {user:?}: check the user and password in the URL"
            )),
            Some(1044) => Some(format!(
                "the user {user:?} may not use the database {database:?}: grant it"
            )),
            Some(1049) => Some(format!(
                "the database {database:?} does not exist: create it (CREATE DATABASE) or fix \
                 the URL"
            )),
            Some(1040) => Some("the server has no free connection slots".to_owned()),
            Some(3159) => Some(
                "the server accepts only TLS connections: add ssl-mode=VERIFY_IDENTITY and \
                 ssl-ca=CA-FILE to the URL"
                    .to_owned(),
            ),
            _ => None,
        },
        sqlx::Error::Configuration(_) => Some(
            "the connection options are not valid (for TLS, build with the `tls` feature)"
                .to_owned(),
        ),
        _ => None,
    }
}

fn tls_hint(target: &str) -> String {
    format!(
        "the TLS handshake with {target} failed: the server's certificate must be signed by \
         the CA in ssl-ca and match the host name in the URL"
    )
}
