//! `nats-kv://` URLs: [`DESCRIPTOR`] parses them into a [`NatsKvTarget`], which opens the
//! store.
//!
//! `nats-kv://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/?bucket=NAME[&replicas=3]`, with
//! `prefix`, `retention`, `clock` (`server` or `local`), `connect_timeout` and
//! `request_timeout`. The scheme is not `nats://`: that URL names a server, as the NATS
//! broker adapters take it, while a store URL names a bucket. A broker URL given as a
//! store's, or the reverse, then fails at once with a clear error instead of opening the
//! wrong thing.

use std::sync::Arc;

use async_trait::async_trait;
use dedup_core::backend::url::{
    BackendDescriptor, OpenTarget, Params, StoreTarget, UrlError, UrlParts, count, duration,
    malformed, redact, server_url,
};
use dedup_core::{Admin, Clock, Result};

use crate::{NatsKvConfig, NatsKvStore};

/// The NATS JetStream key-value backend's part in store URLs (`nats-kv://`), for the
/// `dedup` facade's registry.
pub static DESCRIPTOR: BackendDescriptor = BackendDescriptor {
    name: "nats-kv",
    schemes: &["nats-kv"],
    forms: &["nats-kv://HOST:PORT,HOST:PORT/?bucket=NAME"],
    parse,
    has_schema: false,
    has_outbox: false,
};

/// Parameters of `nats-kv://` URLs.
const PARAMS: &[&str] = &[
    "bucket",
    "prefix",
    "replicas",
    "retention",
    "clock",
    "connect_timeout",
    "request_timeout",
];

/// What a `nats-kv://` URL opens: a bucket on a server or a cluster.
#[derive(Clone)]
pub struct NatsKvTarget {
    /// One `nats://` URL per listed server.
    pub servers: Vec<String>,
    /// The store's configuration.
    pub config: NatsKvConfig,
}

impl std::fmt::Debug for NatsKvTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsKvTarget")
            .field(
                "servers",
                &self.servers.iter().map(|s| redact(s)).collect::<Vec<_>>(),
            )
            .field("config", &self.config)
            .finish()
    }
}

fn parse(url: &UrlParts<'_>) -> std::result::Result<StoreTarget, UrlError> {
    let Some(rest) = url.rest.strip_prefix("//") else {
        return Err(malformed("NATS KV URLs start with nats-kv://"));
    };
    let nodes = rest.strip_suffix('/').unwrap_or(rest);
    if nodes.contains('/') {
        return Err(malformed(
            "a NATS KV URL has no path: name the bucket with ?bucket=NAME",
        ));
    }
    let mut servers = Vec::new();
    for node in nodes.split(',') {
        if node.is_empty() {
            return Err(malformed("empty server: list them as host:port,host:port"));
        }
        servers.push(server_url("nats", &format!("//{node}"), "NATS server")?);
    }
    let mut params = Params::parse(url.query, "nats-kv", PARAMS)?;
    let mut config = NatsKvConfig {
        clock: params.server_or_local_clock()?,
        ..NatsKvConfig::default()
    };
    config.bucket = params
        .take("bucket")
        .ok_or_else(|| malformed("name the bucket: ?bucket=NAME"))?;
    if let Some(prefix) = params.take("prefix") {
        config.prefix = prefix;
    }
    config.replicas = params
        .take_with("replicas", count)?
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    if let Some(t) = params.take_with("retention", duration)? {
        config.retention = t;
    }
    if let Some(t) = params.take_with("connect_timeout", duration)? {
        config.connect_timeout = t;
    }
    if let Some(t) = params.take_with("request_timeout", duration)? {
        config.request_timeout = t;
    }
    config.validate().map_err(UrlError::Config)?;
    Ok(StoreTarget::new(NatsKvTarget { servers, config }))
}

/// The `nats-kv://host:port,host:port/?bucket=BUCKET` store URL of servers listed as
/// comma-separated `nats://host:port` URLs, the form `scripts/services.sh` prints in
/// `DEDUP_NATS_CLUSTER_URLS` (spaces and empty entries are ignored).
pub fn store_url(server_urls: &str, bucket: &str) -> String {
    let nodes: Vec<&str> = server_urls
        .split(',')
        .map(|n| n.trim().trim_start_matches("nats://").trim_end_matches('/'))
        .filter(|n| !n.is_empty())
        .collect();
    format!("nats-kv://{}/?bucket={bucket}", nodes.join(","))
}

#[async_trait]
impl OpenTarget for NatsKvTarget {
    fn descriptor(&self) -> &'static BackendDescriptor {
        &DESCRIPTOR
    }

    fn location(&self) -> String {
        format!(
            "bucket {}, key prefix {}",
            self.config.bucket, self.config.prefix
        )
    }

    fn set_clock(&mut self, clock: Arc<dyn Clock>) {
        self.config.clock = Some(clock);
    }

    fn clone_target(&self) -> Box<dyn OpenTarget> {
        Box::new(self.clone())
    }

    async fn open_admin(self: Box<Self>) -> Result<Arc<dyn Admin>> {
        Ok(Arc::new(
            NatsKvStore::connect(&self.servers, self.config).await?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn target(url: &str) -> std::result::Result<NatsKvTarget, UrlError> {
        let target = parse(&UrlParts::split(url).unwrap())?;
        Ok(target.downcast::<NatsKvTarget>().unwrap())
    }

    #[test]
    fn servers_and_parameters() {
        let t = target("nats-kv://u:pw@a:1,b:2/?bucket=orders&replicas=3&prefix=p&retention=2d")
            .unwrap();
        assert_eq!(t.servers, ["nats://u:pw@a:1", "nats://b:2"]);
        assert_eq!(t.config.bucket, "orders");
        assert_eq!(t.config.replicas, Some(3));
        assert_eq!(t.config.prefix, "p");
        assert_eq!(t.config.retention, Duration::from_secs(2 * 24 * 3600));
        assert!(t.config.clock.is_none());
        assert!(!format!("{t:?}").contains("pw"));
        let t = target("nats-kv://a:1?bucket=b&clock=local").unwrap();
        assert_eq!(t.config.replicas, None);
        assert!(t.config.clock.is_some());
    }

    #[test]
    fn node_urls_become_one_store_url() {
        assert_eq!(
            store_url("nats://127.0.0.1:1, nats://127.0.0.1:2,,", "b"),
            "nats-kv://127.0.0.1:1,127.0.0.1:2/?bucket=b"
        );
    }

    #[test]
    fn bad_urls() {
        for url in [
            "nats-kv:a:1?bucket=b",
            "nats-kv://a:1",
            "nats-kv://a:1,,b:2?bucket=b",
            "nats-kv://a:1/orders",
        ] {
            assert!(
                matches!(target(url), Err(UrlError::Malformed { .. })),
                "{url}"
            );
        }
        assert!(matches!(
            target("nats-kv://a:1?bucket=b&replicas=0"),
            Err(UrlError::InvalidParameter { .. })
        ));
        assert!(matches!(
            target("nats-kv://a:1?bucket=a.b"),
            Err(UrlError::Config(_))
        ));
        assert!(matches!(
            target("nats-kv://a:1?bucket=b&history=2"),
            Err(UrlError::UnknownParameter { .. })
        ));
    }
}
