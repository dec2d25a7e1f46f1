//! `memory:`: the [`MemoryStore`] (and [`MemoryOutbox`]) of this process.

use std::sync::Arc;

use async_trait::async_trait;

use super::{BackendDescriptor, OpenTarget, Params, StoreTarget, UrlError, UrlParts, malformed};
use crate::outbox::{MemoryOutbox, OutboxStore};
use crate::{Admin, Clock, MemoryStore, Result};

/// `memory:`: a [`MemoryStore`] (its outbox: a fresh [`MemoryOutbox`]). Takes `clock=local`.
pub static MEMORY: BackendDescriptor = BackendDescriptor {
    name: "memory",
    schemes: &["memory"],
    forms: &["memory:"],
    parse,
    has_schema: false,
    has_outbox: true,
};

/// What a `memory:` URL opens.
#[derive(Clone, Debug, Default)]
pub struct MemoryTarget {
    /// The clock for lease arithmetic (`None`: the system clock).
    pub clock: Option<Arc<dyn Clock>>,
}

fn parse(url: &UrlParts<'_>) -> std::result::Result<StoreTarget, UrlError> {
    if !matches!(url.rest, "" | "//") {
        return Err(malformed("memory: takes no path"));
    }
    let mut params = Params::parse(url.query, "memory", &["clock"])?;
    let clock = params.local_clock()?;
    Ok(StoreTarget::new(MemoryTarget { clock }))
}

#[async_trait]
impl OpenTarget for MemoryTarget {
    fn descriptor(&self) -> &'static BackendDescriptor {
        &MEMORY
    }

    fn location(&self) -> String {
        "this process's memory (empty)".to_owned()
    }

    fn set_clock(&mut self, clock: Arc<dyn Clock>) {
        self.clock = Some(clock);
    }

    fn clone_target(&self) -> Box<dyn OpenTarget> {
        Box::new(self.clone())
    }

    async fn open_admin(self: Box<Self>) -> Result<Arc<dyn Admin>> {
        Ok(Arc::new(match self.clock {
            Some(c) => MemoryStore::with_clock(c),
            None => MemoryStore::new(),
        }))
    }

    async fn open_outbox(self: Box<Self>) -> Result<Arc<dyn OutboxStore>> {
        Ok(Arc::new(match self.clock {
            Some(c) => MemoryOutbox::with_clock(c),
            None => MemoryOutbox::new(),
        }))
    }
}
