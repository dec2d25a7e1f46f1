//! Connecting: the pool options, and the first connection made eagerly within the connect
//! timeout, so a wrong address, user, password, database or TLS setting surfaces at once
//! with its cause and a hint, instead of as a pool timeout later. A backend supplies what
//! its server says ([`ConnectDialect`]).

use std::time::Duration;

use dedup_core::{Error, Result, TimedOut};
use sqlx::pool::PoolOptions;
use sqlx::{ConnectOptions, Connection, Database, Pool};

use crate::error::SqlBackend;

/// What the errors below say was being done.
pub const CONNECTING: &str = "connecting";

/// Connections idle longer than this are pinged before use; busier ones are not.
pub const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// The connect options of a [`ConnectDialect`]'s database.
pub type Options<D> = <<<D as SqlBackend>::Db as Database>::Connection as Connection>::Options;

/// The pool settings every sqlx backend's configuration has.
#[derive(Clone, Copy, Debug)]
pub struct PoolSettings {
    /// The pool's size (at least 1).
    pub max_connections: u32,
    /// How long a store call waits for a pool connection.
    pub acquire_timeout: Duration,
    /// How long the first connection may take.
    pub connect_timeout: Duration,
}

/// What one backend's server answers when connecting goes wrong.
pub trait ConnectDialect: SqlBackend {
    /// The server as the hints name it ("PostgreSQL", "MySQL / MariaDB").
    const SERVER: &'static str;

    /// The URL parameter naming the CA file ("sslrootcert", "ssl-ca").
    const CA_PARAMETER: &'static str;

    /// `host:port`, or the socket path: where `options` connect (never the password).
    fn target(options: &Options<Self>) -> String;

    /// The host name of `options`.
    fn host(options: &Options<Self>) -> String;

    /// The hint for what only this server answers (its error codes, its TLS negotiation),
    /// or `None` to fall back on the hints every server shares.
    fn server_hint(error: &sqlx::Error, options: &Options<Self>, target: &str) -> Option<String>;
}

/// The pool options every sqlx backend uses: `max_connections` (at least 1),
/// `acquire_timeout`, and a ping before handing out a connection only when it sat idle
/// longer than [`PING_IF_IDLE_FOR`].
///
/// sqlx's default pings every connection at every checkout: one extra round trip per store
/// call, which on a busy server costs about as much as the statement's own. A connection
/// that broke while in use (a server restart) fails its statement with a retryable error
/// and is then dropped; one that sat idle is checked first, as before.
pub fn pool_options<DB: Database>(
    max_connections: u32,
    acquire_timeout: Duration,
) -> PoolOptions<DB> {
    PoolOptions::<DB>::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(acquire_timeout)
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

/// The pool for `options` with `settings`, after one connection was made within
/// `settings.connect_timeout` and closed again.
pub async fn pool<D: ConnectDialect>(
    options: Options<D>,
    settings: PoolSettings,
) -> Result<Pool<D::Db>> {
    let target = D::target(&options);
    let first = tokio::time::timeout(settings.connect_timeout, options.connect()).await;
    match first {
        Ok(Ok(conn)) => {
            // Best effort: the server may drop it first, which is fine.
            let _ = conn.close().await;
        }
        Ok(Err(e)) => {
            let hint = hint::<D>(&e, &options, &target);
            let error = D::error(e).during(CONNECTING);
            return Err(match hint {
                Some(h) => error.with_hint(h),
                None => error,
            });
        }
        Err(_) => {
            let timed_out = TimedOut {
                what: format!("connecting to {target}"),
                after: settings.connect_timeout,
            };
            return Err(Error::backend(D::NAME, true, timed_out)
                .during(CONNECTING)
                .with_hint(format!(
                    "no answer from {target}: is the host reachable, and is it a {} port? \
                     (connect timeout {:?})",
                    D::SERVER,
                    settings.connect_timeout
                )));
        }
    }
    Ok(
        pool_options::<D::Db>(settings.max_connections, settings.acquire_timeout)
            .connect_lazy_with(options),
    )
}

/// `error`, from parsing a connection URL, as the backend's error with its hint.
pub fn invalid_url<D: ConnectDialect>(error: sqlx::Error) -> Error {
    D::error(error)
        .during(CONNECTING)
        .with_hint("the connection URL is not valid")
}

/// The hint for an error of the first connection: the server's own
/// ([`ConnectDialect::server_hint`]), else the one for the usual mistakes every server
/// shares (nothing listening, an unknown host, a failed TLS handshake, options the build
/// cannot use).
pub fn hint<D: ConnectDialect>(
    error: &sqlx::Error,
    options: &Options<D>,
    target: &str,
) -> Option<String> {
    if let Some(hint) = D::server_hint(error, options, target) {
        return Some(hint);
    }
    match error {
        sqlx::Error::Io(io) => Some(match io.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                format!("nothing listens at {target}: is the server running, on that port?")
            }
            _ if io.to_string().contains("lookup") => format!(
                "the host {} could not be resolved: check the host name",
                D::host(options)
            ),
            _ if io.to_string().contains("certificate") => tls_hint::<D>(target),
            _ => format!("the connection to {target} failed"),
        }),
        sqlx::Error::Tls(_) => Some(tls_hint::<D>(target)),
        sqlx::Error::Configuration(_) => Some(
            "the connection options are not valid (for TLS, build with the `tls` feature)"
                .to_owned(),
        ),
        _ => None,
    }
}

/// The hint for a failed TLS handshake with `target`.
pub fn tls_hint<D: ConnectDialect>(target: &str) -> String {
    format!(
        "the TLS handshake with {target} failed: the server's certificate must be signed by \
         the CA in {} and match the host name in the URL",
        D::CA_PARAMETER
    )
}
