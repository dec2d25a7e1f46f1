//! Opening a store: configuration validated before any connection, a cluster node refused by
//! the standalone constructor, an unreachable server a retryable error, and what a store
//! reports about itself.

mod common;

use std::net::TcpListener;
use std::time::Duration;

use common::Target;
use dedup_core::{Capabilities, DedupStore, Error};
use dedup_redis::{RedisConfig, RedisStore};

#[tokio::test]
async fn invalid_configuration_is_rejected_before_connecting() {
    // No server needed: validation comes first, so even an unreachable URL gives InvalidInput.
    let url = "redis://127.0.0.1:1/";
    for config in [
        RedisConfig {
            prefix: "has space:".into(),
            ..RedisConfig::default()
        },
        RedisConfig {
            prefix: "{tag}:".into(),
            ..RedisConfig::default()
        },
        RedisConfig {
            retention: Duration::ZERO,
            ..RedisConfig::default()
        },
        RedisConfig {
            wait_for_replicas: Some((1, Duration::ZERO)),
            ..RedisConfig::default()
        },
    ] {
        let e = RedisStore::connect_with(url, config.clone())
            .await
            .unwrap_err();
        assert!(e.is_invalid_input(), "{config:?}: {e:?}");
        let e = RedisStore::connect_cluster(&[url.to_owned()], config.clone())
            .await
            .unwrap_err();
        assert!(e.is_invalid_input(), "{config:?}: {e:?}");
    }
    let e = RedisStore::connect_cluster(&[], RedisConfig::default())
        .await
        .unwrap_err();
    assert!(e.is_invalid_input(), "{e:?}");
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_backend_error() {
    // A port nobody listens on: bind one, then free it.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let e = RedisStore::connect(&format!("redis://127.0.0.1:{port}/"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Backend {
                backend: "redis",
                retryable: true,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        std::error::Error::source(&e).is_some(),
        "the driver error is kept"
    );
}

#[tokio::test]
async fn a_cluster_node_is_refused_by_the_standalone_constructor() {
    for target in Target::clusters("a_cluster_node_is_refused_by_the_standalone_constructor") {
        let e = RedisStore::connect(&target.node_urls()[0])
            .await
            .unwrap_err();
        assert!(e.is_invalid_input(), "{}: {e:?}", target.name());
    }
}

#[tokio::test]
async fn a_store_describes_itself() {
    for target in Target::all("a_store_describes_itself") {
        let config = RedisConfig {
            prefix: common::unique_prefix("describe"),
            ..RedisConfig::default()
        };
        let store = target.open(config.clone()).await;
        assert_eq!(store.is_cluster(), target.is_cluster());
        assert_eq!(store.config().prefix, config.prefix);
        assert_eq!(
            store.capabilities(),
            Capabilities {
                persistent: true,
                multi_process: true,
                native_batch: true,
                native_ttl: true,
                server_clock: true,
                transactional: false,
                first_claim_time: false,
                failure_causes: true,
            }
        );
        // With an injected clock the store no longer takes lease time from the server.
        let clocked = RedisConfig {
            clock: Some(std::sync::Arc::new(dedup_core::ManualClock::starting_now())),
            ..config.clone()
        };
        assert!(!target.open(clocked).await.capabilities().server_clock);
        let debug = format!("{:?}", store.clone());
        assert!(
            debug.contains("RedisStore") && debug.contains(&config.prefix),
            "{debug}"
        );
    }
}
