//! Connecting: the first connection made eagerly within the connect timeout, so a wrong
//! address, role, password, database or TLS setting surfaces at once with its cause and a
//! hint, instead of as a pool timeout later.

use std::str::FromStr;
use std::time::Duration;

use dedup_core::{Error, Result, TimedOut};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::{ConnectOptions, Connection, PgPool};

use crate::config::PostgresConfig;
use crate::error::{BACKEND, backend, cut_during_tls_negotiation};

/// What the errors below say was being done.
const CONNECTING: &str = "connecting";

/// The pool for `url` with `config`, after one connection was made and closed again.
pub(crate) async fn pool(url: &str, config: &PostgresConfig) -> Result<PgPool> {
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
                    "no answer from {target}: is the host reachable, and is it a PostgreSQL \
                     port? (connect timeout {:?})",
                    config.connect_timeout
                )));
        }
    }
    Ok(pool_options(config).connect_lazy_with(options))
}

/// Connections idle longer than this are pinged before use; busier ones are not.
pub const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// The pool options [`PostgresStore::connect_with`](crate::PostgresStore::connect_with) uses:
/// `config.max_connections`, `config.acquire_timeout`, and a ping before handing out a connection only when it sat
/// idle longer than [`PING_IF_IDLE_FOR`].
///
/// sqlx's default pings every connection at every checkout: one extra round trip per store
/// call, which on a busy server costs about as much as the statement's own. A connection that broke while in
/// use (a server restart) fails its statement with a retryable error and is then dropped;
/// one that sat idle is checked first, as before. Build a pool with these options to share
/// it with [`from_pool`](crate::PostgresStore::from_pool) and get the same behaviour.
pub fn pool_options(config: &PostgresConfig) -> PgPoolOptions {
    PgPoolOptions::new()
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
fn options(url: &str, config: &PostgresConfig) -> Result<PgConnectOptions> {
    let mut options = PgConnectOptions::from_str(url).map_err(|e| {
        backend(e)
            .during(CONNECTING)
            .with_hint("the connection URL is not valid")
    })?;
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

/// `host:port`, or the socket path: where the store connects (never the password).
fn target(options: &PgConnectOptions) -> String {
    match options.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    }
}

/// `e` from the first connection as [`Error::Backend`] with a hint for the usual mistakes.
fn connect_error(e: sqlx::Error, options: &PgConnectOptions, target: &str) -> Error {
    let hint = hint(&e, options, target);
    let error = backend(e).during(CONNECTING);
    match hint {
        Some(h) => error.with_hint(h),
        None => error,
    }
}

fn hint(e: &sqlx::Error, options: &PgConnectOptions, target: &str) -> Option<String> {
    let user = options.get_username();
    let database = options.get_database().unwrap_or(user);
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
        sqlx::Error::Tls(tls) if tls.to_string().contains("does not support TLS") => Some(format!(
            "{target} does not accept TLS connections: use sslmode=prefer or disable in the \
             URL, or enable ssl on the server"
        )),
        sqlx::Error::Tls(_) => Some(tls_hint(target)),
        sqlx::Error::Protocol(message) if cut_during_tls_negotiation(message) => Some(format!(
            "{target} closed the connection before answering the TLS request: the server may \
             be restarting or out of connections, or something in between dropped it; retry"
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
                    "the role {user:?} does not exist or may not log in: check the user in \
                     the URL"
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
         the CA in sslrootcert and match the host name in the URL"
    )
}
