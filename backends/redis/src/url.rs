//! `redis://`, `rediss://`, `redis+cluster://` and `rediss+cluster://` URLs:
//! [`DESCRIPTOR`] parses them into a [`RedisTarget`] (dedup's own parameters into
//! [`RedisConfig`], the driver's passed through), which opens the store.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::backend::url::{
    BackendDescriptor, OpenTarget, Params, StoreTarget, UrlError, UrlParts, count, duration,
    malformed, redact, server_url, tls_available, with_query,
};
use dedup_core::{Admin, Clock, Result};

use crate::{RedisConfig, RedisStore};

/// The Redis / Valkey backend's part in store URLs (`redis://`, `rediss://`,
/// `redis+cluster://`, `rediss+cluster://`), for the `dedup` facade's registry.
pub static DESCRIPTOR: BackendDescriptor = BackendDescriptor {
    name: "redis",
    schemes: &["redis", "rediss", "redis+cluster", "rediss+cluster"],
    forms: &[
        "redis://HOST:PORT/DB",
        "redis+cluster://HOST:PORT,HOST:PORT",
    ],
    parse,
    has_schema: false,
    has_outbox: false,
};

/// Parameters of `redis://` and `redis+cluster://` URLs (`protocol` is the driver's).
const PARAMS: &[&str] = &[
    "prefix",
    "retention",
    "clock",
    "connect_timeout",
    "response_timeout",
    "wait_replicas",
    "wait_timeout",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "protocol",
];

/// What a Redis URL opens: a standalone server or a cluster.
#[derive(Clone)]
#[non_exhaustive]
pub enum RedisTarget {
    /// `redis://...` or `rediss://...`: a standalone server.
    Standalone {
        /// The connection URL handed to the driver (dedup's own parameters removed).
        url: String,
        /// The store's configuration.
        config: RedisConfig,
    },
    /// `redis+cluster://h1:p1,h2:p2` or `rediss+cluster://...`: a Redis Cluster.
    Cluster {
        /// One connection URL per seed node.
        urls: Vec<String>,
        /// The store's configuration.
        config: RedisConfig,
    },
}

impl RedisTarget {
    /// The store's configuration.
    pub fn config(&self) -> &RedisConfig {
        match self {
            RedisTarget::Standalone { config, .. } | RedisTarget::Cluster { config, .. } => config,
        }
    }

    fn config_mut(&mut self) -> &mut RedisConfig {
        match self {
            RedisTarget::Standalone { config, .. } | RedisTarget::Cluster { config, .. } => config,
        }
    }
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisTarget::Standalone { url, config } => f
                .debug_struct("Standalone")
                .field("url", &redact(url))
                .field("config", config)
                .finish(),
            RedisTarget::Cluster { urls, config } => f
                .debug_struct("Cluster")
                .field("urls", &urls.iter().map(|u| redact(u)).collect::<Vec<_>>())
                .field("config", config)
                .finish(),
        }
    }
}

fn parse(url: &UrlParts<'_>) -> std::result::Result<StoreTarget, UrlError> {
    let scheme = url.scheme.to_ascii_lowercase();
    let tls = scheme.starts_with("rediss");
    if scheme.ends_with("+cluster") {
        return cluster(url, tls).map(StoreTarget::new);
    }
    let base = url.server_url(url.scheme, "Redis")?;
    let mut params = Params::parse(url.query, "redis", PARAMS)?;
    let config = config(&mut params, tls)?;
    Ok(StoreTarget::new(RedisTarget::Standalone {
        url: with_query(base, params.rest()),
        config,
    }))
}

fn cluster(url: &UrlParts<'_>, tls: bool) -> std::result::Result<RedisTarget, UrlError> {
    let node_scheme = if tls { "rediss" } else { "redis" };
    let Some(nodes) = url.rest.strip_prefix("//") else {
        return Err(malformed(format!(
            "cluster URLs start with {}://",
            url.scheme
        )));
    };
    let mut params = Params::parse(url.query, "redis-cluster", PARAMS)?;
    let config = config(&mut params, tls)?;
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
    Ok(RedisTarget::Cluster { urls, config })
}

/// The [`RedisConfig`] of a Redis URL's parameters; what is left is the driver's.
fn config(params: &mut Params, tls: bool) -> std::result::Result<RedisConfig, UrlError> {
    let mut config = RedisConfig {
        clock: params.server_or_local_clock()?,
        ..RedisConfig::default()
    };
    if let Some(prefix) = params.take("prefix") {
        config.prefix = prefix;
    }
    if let Some(t) = params.take_with("retention", duration)? {
        config.retention = t;
    }
    if let Some(t) = params.take_with("connect_timeout", duration)? {
        config.connect_timeout = t;
    }
    if let Some(t) = params.take_with("response_timeout", duration)? {
        config.response_timeout = Some(t);
    }
    // `wait_replicas=N` (with `wait_timeout=`, default 1 s): `WAIT N timeout` after each
    // commit (RedisConfig::wait_for_replicas).
    let wait_timeout = params.take_with("wait_timeout", duration)?;
    match params.take_with("wait_replicas", count)? {
        Some(n) => {
            config.wait_for_replicas = Some((n, wait_timeout.unwrap_or(Duration::from_secs(1))))
        }
        None if wait_timeout.is_some() => {
            return Err(malformed("wait_timeout needs wait_replicas"));
        }
        None => {}
    }
    config.tls.ca = params.take("tls_ca").map(Into::into);
    config.tls.client_cert = params.take("tls_cert").map(Into::into);
    config.tls.client_key = params.take("tls_key").map(Into::into);
    tls_available(tls || !config.tls.is_empty(), cfg!(feature = "tls"))?;
    if !tls && !config.tls.is_empty() {
        return Err(malformed(
            "tls_ca, tls_cert and tls_key need a TLS URL: rediss:// or rediss+cluster://",
        ));
    }
    config.validate().map_err(UrlError::Config)?;
    Ok(config)
}

/// The `redis+cluster://host:port,host:port` store URL of a Redis Cluster whose nodes are
/// listed as comma-separated `redis://host:port/` URLs, the form `scripts/services.sh`
/// prints in `DEDUP_REDIS_CLUSTER_URLS` (spaces around the commas and empty entries are
/// ignored).
pub fn cluster_url(node_urls: &str) -> String {
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

#[async_trait]
impl OpenTarget for RedisTarget {
    fn descriptor(&self) -> &'static BackendDescriptor {
        &DESCRIPTOR
    }

    fn backend(&self) -> &'static str {
        match self {
            RedisTarget::Standalone { .. } => "redis",
            RedisTarget::Cluster { .. } => "redis-cluster",
        }
    }

    fn location(&self) -> String {
        format!("key prefix {}", self.config().prefix)
    }

    fn set_clock(&mut self, clock: Arc<dyn Clock>) {
        self.config_mut().clock = Some(clock);
    }

    fn clone_target(&self) -> Box<dyn OpenTarget> {
        Box::new(self.clone())
    }

    async fn open_admin(self: Box<Self>) -> Result<Arc<dyn Admin>> {
        Ok(match *self {
            RedisTarget::Standalone { url, config } => {
                Arc::new(RedisStore::connect_with(&url, config).await?)
            }
            RedisTarget::Cluster { urls, config } => {
                Arc::new(RedisStore::connect_cluster(&urls, config).await?)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> std::result::Result<RedisTarget, UrlError> {
        let target = parse(&UrlParts::split(url).unwrap())?;
        Ok(target.downcast::<RedisTarget>().unwrap())
    }

    #[test]
    fn node_urls_become_one_cluster_url() {
        assert_eq!(
            cluster_url("redis://127.0.0.1:7000/, redis://127.0.0.1:7001/,,"),
            "redis+cluster://127.0.0.1:7000,127.0.0.1:7001"
        );
    }

    #[test]
    fn standalone_and_cluster() {
        let RedisTarget::Standalone { url, config } =
            target("redis://:pw@h:1/0?prefix=p:&protocol=resp3").unwrap()
        else {
            panic!("not standalone")
        };
        assert_eq!(url, "redis://:pw@h:1/0?protocol=resp3");
        assert_eq!(config.prefix, "p:");
        let t = target("redis+cluster://a:1,b:2?prefix=c:").unwrap();
        assert_eq!(t.backend(), "redis-cluster");
        let RedisTarget::Cluster { urls, .. } = t else {
            panic!("not a cluster")
        };
        assert_eq!(urls, ["redis://a:1", "redis://b:2"]);
    }

    #[test]
    fn replica_wait() {
        let wait = |url| match target(url).unwrap() {
            RedisTarget::Standalone { config, .. } => config.wait_for_replicas,
            RedisTarget::Cluster { .. } => panic!("not standalone"),
        };
        assert_eq!(wait("redis://h:1"), None);
        assert_eq!(
            wait("redis://h:1?wait_replicas=2"),
            Some((2, Duration::from_secs(1)))
        );
        assert_eq!(
            wait("redis://h:1?wait_replicas=1&wait_timeout=250ms"),
            Some((1, Duration::from_millis(250)))
        );
        assert!(matches!(
            target("redis://h:1?wait_timeout=1s"),
            Err(UrlError::Malformed { .. })
        ));
        assert!(matches!(
            target("redis://h:1?wait_replicas=0"),
            Err(UrlError::InvalidParameter { .. })
        ));
    }

    #[test]
    fn bad_urls() {
        for url in ["redis:h", "redis+cluster://", "redis+cluster://a:1,,b:2"] {
            assert!(
                matches!(target(url), Err(UrlError::Malformed { .. })),
                "{url}"
            );
        }
        assert!(matches!(
            target("redis://h:1?retention=5w"),
            Err(UrlError::InvalidParameter { .. })
        ));
        assert!(matches!(
            target("redis://h:1?prefix=a b"),
            Err(UrlError::Config(_))
        ));
    }
}
