//! The conformance suite (every lease-mode clause, the model-based test and the admin
//! clauses) against an R3 bucket of the 3-node NATS cluster (`DEDUP_NATS_CLUSTER_URLS`,
//! started by `scripts/services.sh` / `scripts/test.sh`). Each clause has its own key
//! prefix in the one shared bucket.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_conformance::{StoreFactory, TestContext};
use dedup_core::Clock;
use dedup_nats_kv::NatsKvStore;

/// Stores on the cluster's shared R3 test bucket.
struct Factory;

/// How long a request may wait for the cluster here (the store's default is 5 s). The test
/// command runs these clauses beside other test binaries on two cores, where a read once
/// waited longer than 5 s; the clauses test outcomes, not latency.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// [`common::config`] with [`REQUEST_TIMEOUT`].
fn config(prefix: &str, clock: Option<Arc<dyn Clock>>) -> dedup_nats_kv::NatsKvConfig {
    let mut config = common::config(prefix, clock);
    config.request_timeout = REQUEST_TIMEOUT;
    config
}

#[async_trait::async_trait]
impl StoreFactory for Factory {
    type Store = NatsKvStore;

    async fn open(&self, ctx: &TestContext) -> NatsKvStore {
        let servers = common::cluster().expect("DEDUP_NATS_CLUSTER_URLS");
        let clock = Some(ctx.clock.clone() as Arc<dyn Clock>);
        let store = NatsKvStore::connect(&servers, config(&ctx.namespace, clock))
            .await
            .expect("open a store on the NATS cluster");
        answering(&store).await;
        store
    }

    async fn open_named(
        &self,
        ctx: &TestContext,
        name: &str,
    ) -> Option<dedup_core::Result<NatsKvStore>> {
        let servers = common::cluster()?;
        let clock = Some(ctx.clock.clone() as Arc<dyn Clock>);
        Some(NatsKvStore::connect(&servers, config(name, clock)).await)
    }

    fn available(&self) -> bool {
        common::cluster().is_some()
    }
}

/// Waits until `store` answers a read. On a fresh cluster the first clauses start while the
/// test bucket is being created, before its stream has a leader, and a read then times out
/// (seen in the test command's first runs; the crate README states the limit).
async fn answering(store: &NatsKvStore) {
    use dedup_core::DedupStore;
    let key = dedup_core::Key::new("warm-up", "first-read").expect("a valid key");
    let deadline = Instant::now() + Duration::from_secs(90);
    while let Err(e) = store.get(&key).await {
        assert!(
            Instant::now() < deadline,
            "the test bucket never answered a read: {e}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

dedup_conformance::suite!(Factory);
dedup_conformance::admin_suite!(Factory);
