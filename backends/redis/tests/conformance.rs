//! The conformance suite (every lease-mode clause and the model-based test) against a real
//! standalone Redis (`DEDUP_REDIS_URL`) and a real Redis Cluster (`DEDUP_REDIS_CLUSTER_URLS`),
//! both started by `scripts/services.sh` / `scripts/test.sh`.

use std::sync::Arc;
use std::time::Duration;

use dedup_conformance::{StoreFactory, TestContext, server_url};
use dedup_core::Clock;
use dedup_redis::{RedisConfig, RedisStore};

/// Far longer than any clause advances the clock (at most a day or so), so records never
/// vanish by retention mid-clause; purge with shorter retentions must still remove them.
const RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

fn config(ctx: &TestContext) -> RedisConfig {
    RedisConfig {
        prefix: format!("{}:", ctx.namespace),
        retention: RETENTION,
        clock: Some(ctx.clock.clone() as Arc<dyn Clock>),
        ..RedisConfig::default()
    }
}

mod standalone {
    use super::*;

    struct StandaloneFactory;

    #[async_trait::async_trait]
    impl StoreFactory for StandaloneFactory {
        type Store = RedisStore;

        async fn open(&self, ctx: &TestContext) -> RedisStore {
            let url = server_url("DEDUP_REDIS_URL").expect("DEDUP_REDIS_URL");
            RedisStore::connect_with(&url, config(ctx))
                .await
                .unwrap_or_else(|e| panic!("connecting to {url}: {e:?}"))
        }

        async fn open_named(
            &self,
            ctx: &TestContext,
            name: &str,
        ) -> Option<dedup_core::Result<RedisStore>> {
            let url = server_url("DEDUP_REDIS_URL").expect("DEDUP_REDIS_URL");
            let config = RedisConfig {
                prefix: name.to_string(),
                ..config(ctx)
            };
            Some(RedisStore::connect_with(&url, config).await)
        }

        fn available(&self) -> bool {
            server_url("DEDUP_REDIS_URL").is_some()
        }
    }

    dedup_conformance::suite!(StandaloneFactory);
    dedup_conformance::admin_suite!(StandaloneFactory);
}

mod cluster {
    use super::*;

    struct ClusterFactory;

    fn urls() -> Option<Vec<String>> {
        server_url("DEDUP_REDIS_CLUSTER_URLS")
            .map(|v| v.split(',').map(|u| u.trim().to_owned()).collect())
    }

    #[async_trait::async_trait]
    impl StoreFactory for ClusterFactory {
        type Store = RedisStore;

        async fn open(&self, ctx: &TestContext) -> RedisStore {
            let urls = urls().expect("DEDUP_REDIS_CLUSTER_URLS");
            let store = RedisStore::connect_cluster(&urls, config(ctx))
                .await
                .unwrap_or_else(|e| panic!("connecting to the cluster {urls:?}: {e:?}"));
            assert!(store.is_cluster());
            store
        }

        async fn open_named(
            &self,
            ctx: &TestContext,
            name: &str,
        ) -> Option<dedup_core::Result<RedisStore>> {
            let urls = urls().expect("DEDUP_REDIS_CLUSTER_URLS");
            let config = RedisConfig {
                prefix: name.to_string(),
                ..config(ctx)
            };
            Some(RedisStore::connect_cluster(&urls, config).await)
        }

        fn available(&self) -> bool {
            urls().is_some()
        }
    }

    dedup_conformance::suite!(ClusterFactory);
    dedup_conformance::admin_suite!(ClusterFactory);
}
