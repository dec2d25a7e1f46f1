//! Connecting within [`RedisConfig::connect_timeout`], with TLS files when configured, and
//! failing with the cause and a hint (nothing listens there, authentication, TLS, a cluster
//! node given as a standalone server).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dedup_core::{Error, Result, TimedOut};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, RedisResult};

use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::error::{BACKEND, backend};
use crate::primaries::{NodeSettings, Primaries};

/// What the errors below say was being done.
const CONNECTING: &str = "connecting";

/// What opens more connections like the store's own: the purge's (see
/// [`RedisStore`](crate::RedisStore)'s purge, which runs on a connection of its own so its
/// `SCAN`s and pipelines never queue in front of live claims on the client side).
#[derive(Clone)]
pub(crate) enum Connector {
    /// A standalone server: another [`ConnectionManager`].
    Standalone {
        client: redis::Client,
        config: ConnectionManagerConfig,
        target: String,
        tls: bool,
        timeout: Duration,
    },
    /// A cluster: another [`ClusterConnection`](redis::cluster_async::ClusterConnection)
    /// (one more connection per node), and another set of batch connections to the
    /// primaries, reached like the first seed node.
    Cluster {
        client: redis::cluster::ClusterClient,
        primaries: Box<NodeSettings>,
        target: String,
        tls: bool,
        timeout: Duration,
    },
}

impl Connector {
    /// A new connection, within the connect timeout.
    pub(crate) async fn open(&self) -> Result<Conn> {
        match self {
            Connector::Standalone {
                client,
                config,
                target,
                tls,
                timeout,
            } => bounded(
                *timeout,
                target,
                *tls,
                ConnectionManager::new_with_config(client.clone(), config.clone()),
            )
            .await
            .map(Conn::Standalone),
            Connector::Cluster {
                client,
                primaries,
                target,
                tls,
                timeout,
            } => {
                let conn = bounded(*timeout, target, *tls, client.get_async_connection()).await?;
                let primaries = Primaries::new(NodeSettings::clone(primaries));
                Ok(Conn::Cluster(conn, Arc::new(primaries)))
            }
        }
    }
}

/// A standalone server behind a [`ConnectionManager`]. One plain connection is made first
/// (within the timeout, no retries) so that its error is the one reported; it also checks
/// that the server is not a cluster node.
pub(crate) async fn standalone(url: &str, config: &RedisConfig) -> Result<(Conn, Connector)> {
    let client = client(url, config)?;
    let target = client.get_connection_info().addr().to_string();
    let tls = url.starts_with("rediss:");
    let timeout = config.connect_timeout;
    let probe_config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    let probe = bounded(
        timeout,
        &target,
        tls,
        client.get_multiplexed_async_connection_with_config(&probe_config),
    )
    .await?;
    let info: String = bounded(
        timeout,
        &target,
        tls,
        redis::cmd("INFO")
            .arg("cluster")
            .query_async(&mut probe.clone()),
    )
    .await?;
    drop(probe);
    if info.lines().any(|l| l.trim() == "cluster_enabled:1") {
        return Err(Error::invalid(
            "redis url",
            format!(
                "the server at {target} is a Redis Cluster node: use a redis+cluster:// URL \
                 (RedisStore::connect_cluster)"
            ),
        ));
    }
    // Reconnection backs off exponentially from 100 ms, capped at 1 s between attempts
    // (6 attempts); every later request triggers a new round.
    let manager_config = ConnectionManagerConfig::new()
        .set_response_timeout(config.response_timeout)
        .set_connection_timeout(Some(timeout))
        .set_max_delay(Duration::from_secs(1));
    let connector = Connector::Standalone {
        client,
        config: manager_config,
        target,
        tls,
        timeout,
    };
    Ok((connector.open().await?, connector))
}

/// A Redis Cluster through its seed nodes' URLs (at least one, or
/// [`Error::InvalidInput`]).
pub(crate) async fn cluster(urls: &[String], config: &RedisConfig) -> Result<(Conn, Connector)> {
    // Batches reach the primaries on connections of their own (see `primaries`), with the
    // first seed's credentials and TLS settings.
    let seed = urls
        .first()
        .ok_or_else(|| Error::invalid("cluster urls", "at least one node URL is needed"))?;
    let target = urls
        .iter()
        .map(|u| {
            redis::IntoConnectionInfo::into_connection_info(u.as_str())
                .map(|i| i.addr().to_string())
                .unwrap_or_else(|_| "?".to_owned())
        })
        .collect::<Vec<_>>()
        .join(",");
    let tls = urls.iter().any(|u| u.starts_with("rediss:"));
    let mut builder = ClusterClientBuilder::new(urls.iter().map(String::as_str))
        .connection_timeout(config.connect_timeout);
    if let Some(t) = config.response_timeout {
        builder = builder.response_timeout(t);
    }
    builder = with_certificates(builder, config)?;
    let client = builder
        .build()
        .map_err(|e| connect_error(e, &target, tls))?;
    let primaries = Box::new(NodeSettings {
        template: self::client(seed, config)?.get_connection_info().clone(),
        config: AsyncConnectionConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(config.response_timeout),
    });
    let connector = Connector::Cluster {
        client,
        primaries,
        target,
        tls,
        timeout: config.connect_timeout,
    };
    Ok((connector.open().await?, connector))
}

/// `fut` within `timeout`, its error (or the timeout) as a connect error.
async fn bounded<T>(
    timeout: Duration,
    target: &str,
    tls: bool,
    fut: impl Future<Output = RedisResult<T>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(connect_error(e, target, tls)),
        Err(_) => {
            let timed_out = TimedOut {
                what: format!("connecting to {target}"),
                after: timeout,
            };
            Err(Error::backend(BACKEND, true, timed_out)
                .during(CONNECTING)
                .with_hint(format!(
                    "no answer from {target}: is the host reachable, and is it a Redis port? \
                     (connect timeout {timeout:?})"
                )))
        }
    }
}

/// `e` as [`Error::Backend`] with a hint for the usual mistakes.
fn connect_error(e: RedisError, target: &str, tls: bool) -> Error {
    // redis-rs reports a cluster's failed initial connections as one error whose detail
    // is the nodes' errors in words: look for the refusal there too.
    let hint = if e.is_connection_refusal() || e.to_string().contains("Connection refused") {
        Some(format!(
            "nothing listens at {target}: is the server running, on that port?"
        ))
    } else if e.kind() == ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH"))
    {
        Some("authentication failed: check the user name and password in the URL".to_owned())
    } else if e.kind() == ErrorKind::InvalidClientConfig {
        Some("the connection URL or TLS settings are not valid".to_owned())
    } else if tls && e.to_string().contains("received fatal alert") {
        Some(format!(
            "the server at {target} ended the TLS handshake: if it checks client \
             certificates, check tls_cert and tls_key (signed by a CA the server trusts)"
        ))
    } else if tls && (e.is_io_error() || e.is_connection_dropped()) {
        Some(format!(
            "the TLS connection to {target} failed: check the CA (tls_ca) that signed the \
             server's certificate, and that the host name matches it"
        ))
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
        Some(format!(
            "the server at {target} closed the connection: if it only accepts TLS, use \
             rediss://"
        ))
    } else {
        None
    };
    let error = backend(e).during(CONNECTING);
    match hint {
        Some(h) => error.with_hint(h),
        None => error,
    }
}

/// The client for `url`, with the configured TLS files.
fn client(url: &str, config: &RedisConfig) -> Result<redis::Client> {
    let built = {
        #[cfg(feature = "tls")]
        {
            if config.tls.is_empty() {
                redis::Client::open(url)
            } else {
                redis::Client::build_with_tls(url, certificates(config)?)
            }
        }
        #[cfg(not(feature = "tls"))]
        {
            no_tls(url.starts_with("rediss:"), config)?;
            redis::Client::open(url)
        }
    };
    built.map_err(|e| {
        backend(e)
            .during(CONNECTING)
            .with_hint("the connection URL is not valid")
    })
}

#[cfg(feature = "tls")]
fn with_certificates(
    builder: ClusterClientBuilder,
    config: &RedisConfig,
) -> Result<ClusterClientBuilder> {
    Ok(if config.tls.is_empty() {
        builder
    } else {
        builder.certs(certificates(config)?)
    })
}

#[cfg(not(feature = "tls"))]
fn with_certificates(
    builder: ClusterClientBuilder,
    config: &RedisConfig,
) -> Result<ClusterClientBuilder> {
    no_tls(false, config)?;
    Ok(builder)
}

/// Without the `tls` feature: refuse `rediss://` and TLS files up front.
#[cfg(not(feature = "tls"))]
fn no_tls(rediss: bool, config: &RedisConfig) -> Result<()> {
    if rediss || !config.tls.is_empty() {
        return Err(Error::invalid(
            "tls",
            "dedup-redis was built without its `tls` feature",
        ));
    }
    Ok(())
}

#[cfg(feature = "tls")]
fn certificates(config: &RedisConfig) -> Result<redis::TlsCertificates> {
    use dedup_core::TlsFiles;
    let tls = &config.tls;
    let root_cert = tls.ca.as_deref().map(TlsFiles::read).transpose()?;
    let client_tls = match (&tls.client_cert, &tls.client_key) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: TlsFiles::read(cert)?,
            client_key: TlsFiles::read(key)?,
        }),
        _ => None,
    };
    Ok(redis::TlsCertificates {
        client_tls,
        root_cert,
    })
}
