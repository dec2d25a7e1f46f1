//! The bound on messages in flight and the graceful drain, shared by every consumer.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::Shutdown;

/// Handler tasks of one consumer, at most `max` at once.
pub(crate) struct InFlight {
    slots: Arc<Semaphore>,
    max: usize,
    tasks: JoinSet<()>,
}

impl InFlight {
    pub(crate) fn new(max: usize) -> Self {
        InFlight {
            slots: Arc::new(Semaphore::new(max)),
            max,
            tasks: JoinSet::new(),
        }
    }

    /// Wait for a free slot; `None` once `shutdown` fires.
    pub(crate) async fn slot(&mut self, shutdown: &Shutdown) -> Option<OwnedSemaphorePermit> {
        self.reap();
        if shutdown.is_set() {
            return None;
        }
        // A free slot needs no wait (nor a shutdown watcher registered and dropped).
        if let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() {
            return Some(permit);
        }
        tokio::select! {
            biased;
            _ = shutdown.wait() => None,
            permit = Arc::clone(&self.slots).acquire_owned() => permit.ok(),
        }
    }

    /// Every free slot (at least one, waited for); empty once `shutdown` fires.
    pub(crate) async fn slots(&mut self, shutdown: &Shutdown) -> Vec<OwnedSemaphorePermit> {
        let Some(first) = self.slot(shutdown).await else {
            return Vec::new();
        };
        let mut permits = Vec::with_capacity(1 + self.slots.available_permits());
        permits.push(first);
        while let Ok(p) = Arc::clone(&self.slots).try_acquire_owned() {
            permits.push(p);
        }
        permits
    }

    /// Run `work` holding `permit`: in a task of its own, or right here when at most one
    /// message may be in flight (the caller could not take another before it ends anyway,
    /// and a task would only add a spawn and a wake-up per message).
    pub(crate) async fn start<F>(&mut self, permit: OwnedSemaphorePermit, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if self.max == 1 {
            work.await;
            drop(permit);
            return;
        }
        self.tasks.spawn(async move {
            work.await;
            drop(permit);
        });
    }

    /// Wait for every started handler to finish and settle.
    pub(crate) async fn drain(mut self) {
        while self.tasks.join_next().await.is_some() {}
    }

    fn reap(&mut self) {
        while self.tasks.try_join_next().is_some() {}
    }
}
