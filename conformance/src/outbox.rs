//! What a backend provides to run the outbox clauses: a factory of isolated outboxes and
//! a producer that writes to them in transactions.

use std::sync::Arc;

use async_trait::async_trait;
use dedup_core::Result;
use dedup_core::outbox::{MemoryOutbox, OutboxMessage, OutboxStore};

use crate::{TestContext, TxEnd};

/// Writes messages the way an application does: with the backend's `enqueue`, inside a
/// transaction of its own that also writes a business row.
#[async_trait]
pub trait OutboxProducer: Send + Sync {
    /// Enqueue `messages` in one transaction, ended as `end` says.
    async fn enqueue(&self, messages: &[OutboxMessage], end: TxEnd) -> Result<()>;

    /// Enqueue `messages` in a transaction left open, for [`OpenTx::commit`] later. `None`
    /// when the backend cannot keep a writing transaction open beside others (SQLite has
    /// one writer at a time, so no other row can commit while it is open).
    async fn enqueue_open(&self, messages: &[OutboxMessage]) -> Result<Option<Box<dyn OpenTx>>>;
}

/// A producer's transaction left open by [`OutboxProducer::enqueue_open`].
#[async_trait]
pub trait OpenTx: Send {
    /// Commit it.
    async fn commit(self: Box<Self>) -> Result<()>;
}

/// An outbox under test.
#[derive(Clone)]
pub struct OutboxUnderTest {
    /// What relays use.
    pub store: Arc<dyn OutboxStore>,
    /// What producers use.
    pub producer: Arc<dyn OutboxProducer>,
}

/// Builds outboxes for the outbox clauses. Implemented once per backend, in its
/// `tests/outbox.rs`.
#[async_trait]
pub trait OutboxFactory: Send + Sync + 'static {
    /// Open the outbox for `ctx.namespace`, on `ctx.clock`. Opening twice with the same
    /// context gives a second handle on the same rows (a second node). Panics on failure
    /// (this is test code).
    async fn open(&self, ctx: &TestContext) -> OutboxUnderTest;

    /// Whether the backend's server is reachable (see
    /// [`StoreFactory::available`](crate::StoreFactory::available)).
    fn available(&self) -> bool {
        true
    }
}

/// Called by the generated tests: true when the clause should run; prints why not
/// otherwise.
#[doc(hidden)]
pub fn should_run_outbox<F: OutboxFactory>(factory: &F, clause: &str) -> bool {
    crate::harness::report_available(factory.available(), clause)
}

/// The outbox clauses on [`MemoryOutbox`], the reference model (one outbox per namespace).
#[derive(Clone, Debug, Default)]
pub struct MemoryOutboxFactory {
    outboxes: Arc<std::sync::Mutex<std::collections::HashMap<String, MemoryOutbox>>>,
}

struct MemoryProducer(MemoryOutbox);

struct MemoryOpen(dedup_core::outbox::MemoryOutboxTx);

#[async_trait]
impl OpenTx for MemoryOpen {
    async fn commit(self: Box<Self>) -> Result<()> {
        self.0.commit();
        Ok(())
    }
}

#[async_trait]
impl OutboxProducer for MemoryProducer {
    async fn enqueue(&self, messages: &[OutboxMessage], end: TxEnd) -> Result<()> {
        let mut tx = self.0.begin();
        tx.enqueue(messages)?;
        match end {
            TxEnd::Commit => tx.commit(),
            TxEnd::Rollback => tx.rollback(),
        }
        Ok(())
    }

    async fn enqueue_open(&self, messages: &[OutboxMessage]) -> Result<Option<Box<dyn OpenTx>>> {
        let mut tx = self.0.begin();
        tx.enqueue(messages)?;
        Ok(Some(Box::new(MemoryOpen(tx))))
    }
}

#[async_trait]
impl OutboxFactory for MemoryOutboxFactory {
    async fn open(&self, ctx: &TestContext) -> OutboxUnderTest {
        let outbox = self
            .outboxes
            .lock()
            .unwrap()
            .entry(ctx.namespace.clone())
            .or_insert_with(|| MemoryOutbox::with_clock(ctx.clock.clone()))
            .clone();
        OutboxUnderTest {
            store: Arc::new(outbox.clone()),
            producer: Arc::new(MemoryProducer(outbox)),
        }
    }
}
