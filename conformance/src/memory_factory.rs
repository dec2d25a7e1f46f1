//! [`MemoryFactory`]: the factory that runs the suite on [`MemoryStore`].

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use dedup_core::MemoryStore;

use crate::{StoreFactory, TestContext};

/// Opens [`MemoryStore`]s: one per namespace, so opening a context twice gives a second
/// handle on the same records (a clone sharing the map), as the harness requires.
///
/// It is also the smallest example of a factory.
#[derive(Debug, Default)]
pub struct MemoryFactory {
    stores: Mutex<HashMap<String, MemoryStore>>,
}

#[async_trait]
impl StoreFactory for MemoryFactory {
    type Store = MemoryStore;

    async fn open(&self, ctx: &TestContext) -> MemoryStore {
        let mut stores = self
            .stores
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        stores
            .entry(ctx.namespace.clone())
            .or_insert_with(|| MemoryStore::with_clock(ctx.clock.clone()))
            .clone()
    }
}
