//! The conformance suite (every lease-mode clause and the model-based test) against a real
//! standalone server and a real cluster, of Redis (`DEDUP_REDIS_URL`,
//! `DEDUP_REDIS_CLUSTER_URLS`: every operation but a fresh-key claim is a script) and of
//! Valkey (`DEDUP_VALKEY_URL`, `DEDUP_VALKEY_CLUSTER_URLS`: the holder's commits and
//! renewals are one `SET ... IFEQ`), all started by `scripts/services.sh` /
//! `scripts/test.sh`. One factory, four modules of the same tests.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Server, Target};
use dedup_conformance::{StoreFactory, TestContext};
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

/// Stores on one server's standalone node or cluster.
struct Factory {
    server: Server,
    cluster: bool,
}

impl Factory {
    /// The target; `None` when its URL is not set (a panic under `DEDUP_TEST_STRICT=1`).
    fn target(&self) -> Option<Target> {
        if self.cluster {
            Target::cluster(self.server)
        } else {
            Target::standalone(self.server)
        }
    }

    async fn connect(&self, config: RedisConfig) -> dedup_core::Result<RedisStore> {
        match self.target().expect("the server's URL") {
            Target::Standalone(_, url) => RedisStore::connect_with(&url, config).await,
            Target::Cluster(_, urls) => RedisStore::connect_cluster(&urls, config).await,
        }
    }
}

#[async_trait::async_trait]
impl StoreFactory for Factory {
    type Store = RedisStore;

    async fn open(&self, ctx: &TestContext) -> RedisStore {
        let target = self.target().expect("the server's URL");
        let store = target.open(config(ctx)).await;
        assert_eq!(store.is_cluster(), self.cluster);
        store
    }

    async fn open_named(
        &self,
        ctx: &TestContext,
        name: &str,
    ) -> Option<dedup_core::Result<RedisStore>> {
        let config = RedisConfig {
            prefix: name.to_string(),
            ..config(ctx)
        };
        Some(self.connect(config).await)
    }

    fn available(&self) -> bool {
        self.target().is_some()
    }
}

macro_rules! on {
    ($module:ident, $server:expr, $cluster:expr) => {
        mod $module {
            use super::*;

            dedup_conformance::suite!(Factory {
                server: $server,
                cluster: $cluster
            });
            dedup_conformance::admin_suite!(Factory {
                server: $server,
                cluster: $cluster
            });
        }
    };
}

on!(standalone, Server::Redis, false);
on!(cluster, Server::Redis, true);
on!(valkey_standalone, Server::Valkey, false);
on!(valkey_cluster, Server::Valkey, true);
