//! MemoryStore, the reference model, passes the whole suite.

use dedup_conformance::{StoreFactory, TestContext};
use dedup_core::MemoryStore;

struct MemoryFactory;

#[async_trait::async_trait]
impl StoreFactory for MemoryFactory {
    type Store = MemoryStore;
    async fn open(&self, ctx: &TestContext) -> MemoryStore {
        MemoryStore::with_clock(ctx.clock.clone())
    }
}

dedup_conformance::suite!(MemoryFactory);
