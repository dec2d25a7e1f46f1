//! [`OpenTarget`] and [`StoreTarget`]: a parsed store URL, ready to open.

use std::any::Any;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use super::BackendDescriptor;
use crate::outbox::OutboxStore;
use crate::{Admin, Clock, Result};

/// What a backend's URL parser returns: the configuration to open, and how. Implemented
/// by each backend's target type (`PostgresTarget`...); its `Debug` must mask passwords
/// (use [`redact`](super::redact) on connection URLs).
#[async_trait]
pub trait OpenTarget: Any + Send + Sync + fmt::Debug {
    /// The backend's descriptor.
    fn descriptor(&self) -> &'static BackendDescriptor;

    /// The backend's name for people (`postgres`, `redis-cluster`): the descriptor's, or
    /// a more precise one.
    fn backend(&self) -> &'static str {
        self.descriptor().name
    }

    /// Where the store keeps its records, for people: `table SCHEMA.T`, `key prefix P`...
    fn location(&self) -> String;

    /// The database file, for stores kept in one; `None` otherwise.
    fn file(&self) -> Option<&Path> {
        None
    }

    /// Use `clock` for lease arithmetic instead of the URL's or the backend's default.
    fn set_clock(&mut self, clock: Arc<dyn Clock>);

    /// A copy, boxed (a [`StoreTarget`] is `Clone`).
    fn clone_target(&self) -> Box<dyn OpenTarget>;

    /// Open the store (connect, create or check the schema) as an [`Admin`] handle.
    async fn open_admin(self: Box<Self>) -> Result<Arc<dyn Admin>>;

    /// Open the store's outbox; called only when the descriptor's
    /// [`has_outbox`](BackendDescriptor::has_outbox) is true. The default refuses.
    async fn open_outbox(self: Box<Self>) -> Result<Arc<dyn OutboxStore>> {
        Err(crate::Error::invalid(
            "outbox",
            format!("the {} store has no outbox", self.backend()),
        ))
    }
}

/// A parsed store URL's backend and configuration, opened by
/// [`open_admin`](Self::open_admin). Look inside with [`downcast_ref`](Self::downcast_ref)
/// to the backend's target type (`dedup_postgres::PostgresTarget`...).
pub struct StoreTarget(Box<dyn OpenTarget>);

impl StoreTarget {
    /// Wrap a backend's target.
    pub fn new(target: impl OpenTarget) -> Self {
        StoreTarget(Box::new(target))
    }

    /// The backend's target, when it is a `T`.
    pub fn downcast_ref<T: OpenTarget>(&self) -> Option<&T> {
        let any: &dyn Any = &*self.0;
        any.downcast_ref()
    }

    /// The backend's target, when it is a `T` (to adjust and open it yourself).
    pub fn downcast<T: OpenTarget>(self) -> std::result::Result<T, Self> {
        let any: &dyn Any = &*self.0;
        if !any.is::<T>() {
            return Err(self);
        }
        let any: Box<dyn Any> = self.0;
        Ok(*any.downcast::<T>().expect("the type was just checked"))
    }

    /// The backend's descriptor.
    pub fn descriptor(&self) -> &'static BackendDescriptor {
        self.0.descriptor()
    }

    /// The target, as the trait object.
    pub fn as_target(&self) -> &dyn OpenTarget {
        &*self.0
    }

    /// The target, as the trait object, to change.
    pub fn as_target_mut(&mut self) -> &mut dyn OpenTarget {
        &mut *self.0
    }

    /// Open the store as an [`Admin`] handle.
    pub async fn open_admin(self) -> Result<Arc<dyn Admin>> {
        self.0.open_admin().await
    }

    /// Open the store's outbox (check [`BackendDescriptor::has_outbox`] first).
    pub async fn open_outbox(self) -> Result<Arc<dyn OutboxStore>> {
        self.0.open_outbox().await
    }
}

impl Clone for StoreTarget {
    fn clone(&self) -> Self {
        StoreTarget(self.0.clone_target())
    }
}

impl fmt::Debug for StoreTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
