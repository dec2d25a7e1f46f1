//! The conformance suite on the example store, opened by URL through `dedup`, as a
//! program that registered it would.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use dedup::DedupStore;
use dedup_conformance::{StoreFactory, TestContext};

/// Opens `example:<namespace>` on the context's clock: the same namespace twice is two
/// handles on one store.
struct ByUrl;

#[async_trait]
impl StoreFactory for ByUrl {
    type Store = Arc<dyn DedupStore>;

    async fn open(&self, ctx: &TestContext) -> Arc<dyn DedupStore> {
        common::register();
        let url = format!("example:{}", ctx.namespace);
        dedup::open_with_clock(&url, ctx.clock.clone())
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"))
    }
}

dedup_conformance::suite!(ByUrl);
