//! [`MemoryFactory`]: the factory that runs the suite on [`MemoryStore`], and
//! [`Namespaces`], the per-namespace registry in-process factories need.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use dedup_core::MemoryStore;

use crate::{StoreFactory, TestContext};

/// For factories of in-process stores: one store per namespace, so that opening a context
/// twice gives a second handle on the same records (a clone sharing them), as
/// [`StoreFactory::open`] requires.
#[derive(Debug)]
pub struct Namespaces<S> {
    stores: Mutex<HashMap<String, S>>,
}

impl<S> Default for Namespaces<S> {
    fn default() -> Self {
        Namespaces {
            stores: Mutex::new(HashMap::new()),
        }
    }
}

impl<S: Clone> Namespaces<S> {
    /// The store of `ctx.namespace`, made by `create` the first time.
    pub fn open(&self, ctx: &TestContext, create: impl FnOnce() -> S) -> S {
        self.stores
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(ctx.namespace.clone())
            .or_insert_with(create)
            .clone()
    }
}

/// Opens [`MemoryStore`]s on the context's clock, one per namespace. It is also the
/// smallest example of a factory.
#[derive(Debug, Default)]
pub struct MemoryFactory {
    stores: Namespaces<MemoryStore>,
}

#[async_trait]
impl StoreFactory for MemoryFactory {
    type Store = MemoryStore;

    async fn open(&self, ctx: &TestContext) -> MemoryStore {
        self.stores
            .open(ctx, || MemoryStore::with_clock(ctx.clock.clone()))
    }
}
