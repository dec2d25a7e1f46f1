//! What the kit drives: a [`Consumer`] (one delivery in, an ack or a nack out), the
//! [`Cx`] it gets per delivery, the [`Effects`] ledger, and [`lease`], the consumer that
//! runs an application's handler under the lease-mode [`Inbox`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use dedup_core::{BoxError, DedupStore, Handled, Inbox, InboxConfig, InboxError, Key, Lease};
use futures::future::BoxFuture;

use crate::gated::Gated;
use crate::world::{Actor, Interrupted, Point, World};

/// One message of a case. Its [`id`](Self::id) is unique to the case (the kit runs every
/// case against the same store, so ids never repeat across cases or runs); its
/// [`index`](Self::index) is its number in the schedule (`m0`, `m1`, ...); its
/// [`payload`](Self::payload) comes from [`Kit::payloads`](crate::Kit::payloads).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Message {
    id: String,
    index: usize,
    payload: Vec<u8>,
}

impl Message {
    pub(crate) fn new(prefix: &str, index: usize, payload: Vec<u8>) -> Self {
        Message {
            id: format!("{prefix}-m{index}"),
            index,
            payload,
        }
    }

    /// The message's body: drawn from the [`Kit::payloads`](crate::Kit::payloads)
    /// generator, empty without one. Every delivery of the message carries the same.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The message id (the key's message id; use it as the business id too, e.g. the
    /// order an invoice is for).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The message's number in the schedule.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Its name in stories: `m0`, `m1`, ...
    pub fn name(&self) -> String {
        format!("m{}", self.index)
    }
}

/// Which guarantee the kit checks (see the crate docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Lease mode ([`Inbox`]): an effect may repeat only where its run was interrupted
    /// between the effect and the commit, and never when made with an idempotency key.
    Lease,
    /// Transactional mode (`TxInbox`): no effect ever repeats.
    Tx,
}

/// The kit's ledger, as one run sees it: the external systems a handler calls (a payment
/// provider, a mail service). Each call is a stopping point first (the kit may kill the
/// worker or fail the call there), then an effect the kit records for its checks. A call
/// with an idempotency key is applied once per key, as a provider that honours keys does.
///
/// The `_blocking` variants are for synchronous handlers running on a blocking thread (the
/// SQLite `TxInbox` handler, or work inside `spawn_blocking`); never call them on an async
/// task.
#[derive(Clone)]
pub struct Effects {
    world: Arc<World>,
    actor: Actor,
    in_tx: Arc<AtomicBool>,
}

impl std::fmt::Debug for Effects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Effects")
            .field("worker", &self.actor.worker)
            .field("message", &self.actor.message)
            .finish_non_exhaustive()
    }
}

impl Effects {
    /// Call the external system `name` for this run's message, without an idempotency key:
    /// every call that passes its stopping point is an effect.
    pub async fn call(&self, name: &str) -> Result<(), Interrupted> {
        self.pass(Point::Effect(name.to_owned())).await?;
        self.world.effect(&self.actor, name, None);
        Ok(())
    }

    /// Call `name` with an idempotency key (pass [`Lease::idempotency_key`]): the system
    /// applies the first call per key and answers later ones without repeating it.
    pub async fn call_with_key(&self, name: &str, key: &str) -> Result<(), Interrupted> {
        self.pass(Point::Effect(name.to_owned())).await?;
        self.world.effect(&self.actor, name, Some(key));
        Ok(())
    }

    /// [`call`](Self::call) from a blocking thread.
    pub fn call_blocking(&self, name: &str) -> Result<(), Interrupted> {
        self.pass_blocking(Point::Effect(name.to_owned()))?;
        self.world.effect(&self.actor, name, None);
        Ok(())
    }

    /// [`call_with_key`](Self::call_with_key) from a blocking thread.
    pub fn call_with_key_blocking(&self, name: &str, key: &str) -> Result<(), Interrupted> {
        self.pass_blocking(Point::Effect(name.to_owned()))?;
        self.world.effect(&self.actor, name, Some(key));
        Ok(())
    }

    /// A stopping point without an effect: mark a place in the handler where a kill or a
    /// failure should be tried (after an insert into the application's own tables, say).
    pub async fn probe(&self, label: &str) -> Result<(), Interrupted> {
        self.pass(Point::Probe(label.to_owned())).await?;
        self.world
            .tell(&self.actor, format!("passes {label:?}"), false);
        Ok(())
    }

    /// [`probe`](Self::probe) from a blocking thread.
    pub fn probe_blocking(&self, label: &str) -> Result<(), Interrupted> {
        self.pass_blocking(Point::Probe(label.to_owned()))?;
        self.world
            .tell(&self.actor, format!("passes {label:?}"), false);
        Ok(())
    }

    /// This run's message.
    pub fn message(&self) -> &crate::Message {
        &self.world.messages[self.actor.message]
    }

    async fn pass(&self, point: Point) -> Result<(), Interrupted> {
        let in_tx = self.in_tx.load(Ordering::SeqCst);
        self.world.gate(&self.actor, point, in_tx).await
    }

    fn pass_blocking(&self, point: Point) -> Result<(), Interrupted> {
        let in_tx = self.in_tx.load(Ordering::SeqCst);
        self.world.gate_blocking(&self.actor, point, in_tx)
    }

    /// Transactional shells: the handler starts inside its transaction under `lease`.
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
        allow(dead_code)
    )]
    pub(crate) fn enter_tx(&self, lease: &Lease) {
        self.in_tx.store(true, Ordering::SeqCst);
        self.world.entered(&self.actor, lease, true);
    }

    /// The sqlx shell: the stopping point after the handler, before the commit.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) async fn before_tx_commit(&self) -> Result<(), Interrupted> {
        self.world.gate(&self.actor, Point::TxCommit, true).await
    }

    /// The SQLite shell: the stopping point after the handler, before the commit, from a
    /// blocking thread.
    #[cfg(feature = "sqlite")]
    pub(crate) fn before_tx_commit_blocking(&self) -> Result<(), Interrupted> {
        self.world.gate_blocking(&self.actor, Point::TxCommit, true)
    }

    /// The transaction ended (committed or rolled back).
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
        allow(dead_code)
    )]
    pub(crate) fn leave_tx(&self) {
        self.in_tx.store(false, Ordering::SeqCst);
    }
}

/// What a consumer gets for one delivery: the message, the store (every operation a
/// stopping point), an [`Inbox`] over it with the kit's configuration, the [`Effects`]
/// ledger, and the broker's ack and nack.
///
/// A consumer that returns without acking or nacking leaves the delivery unacknowledged:
/// the broker delivers it again.
pub struct Cx {
    world: Arc<World>,
    actor: Actor,
    delivery: u32,
    effects: Effects,
    store: Arc<dyn DedupStore>,
}

impl std::fmt::Debug for Cx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cx")
            .field("worker", &self.actor.worker)
            .field("message", self.message())
            .field("delivery", &self.delivery)
            .finish_non_exhaustive()
    }
}

impl Cx {
    pub(crate) fn new(world: Arc<World>, actor: Actor, delivery: u32) -> Self {
        let effects = Effects {
            world: Arc::clone(&world),
            actor: actor.clone(),
            in_tx: Arc::new(AtomicBool::new(false)),
        };
        let store: Arc<dyn DedupStore> = Arc::new(Gated {
            world: Arc::clone(&world),
            actor: actor.clone(),
        });
        Cx {
            world,
            actor,
            delivery,
            effects,
            store,
        }
    }

    /// The message delivered.
    pub fn message(&self) -> &Message {
        &self.world.messages[self.actor.message]
    }

    /// Which delivery of the message this is (1 for the first).
    pub fn delivery(&self) -> u32 {
        self.delivery
    }

    /// The message's key: the kit's consumer name and the message id.
    pub fn key(&self) -> Key {
        self.world.key(self.actor.message)
    }

    /// The store under test; every operation is a stopping point.
    pub fn store(&self) -> Arc<dyn DedupStore> {
        Arc::clone(&self.store)
    }

    /// A lease-mode inbox over [`store`](Self::store) with the kit's configuration (its
    /// own renewal timer is off: the kit renews live workers' leases when it moves the
    /// clock).
    pub fn inbox(&self) -> Inbox<dyn DedupStore> {
        Inbox::from_arc(self.store(), self.world.config.clone())
    }

    /// The configuration the kit runs inboxes with.
    pub fn config(&self) -> &InboxConfig {
        &self.world.config
    }

    /// The ledger of external effects for this run.
    pub fn effects(&self) -> Effects {
        self.effects.clone()
    }

    /// A stopping point of the consumer's own (before the transactional claim, say).
    pub async fn stop(&self, point: Point) -> Result<(), Interrupted> {
        self.world.gate(&self.actor, point, false).await
    }

    /// Add `line` to the story, as this worker.
    pub fn tell(&self, line: &str) {
        self.world.tell(&self.actor, line.to_owned(), false);
    }

    /// Acknowledge the delivery (a stopping point first: a kill there loses the ack, and
    /// the broker delivers the message again).
    pub async fn ack(&self) -> Result<(), Interrupted> {
        self.world.gate(&self.actor, Point::Ack, false).await?;
        self.world.settled(&self.actor, true);
        Ok(())
    }

    /// Give the delivery back to the broker, which queues it again.
    pub async fn nack(&self) -> Result<(), Interrupted> {
        self.world.gate(&self.actor, Point::Nack, false).await?;
        self.world.settled(&self.actor, false);
        Ok(())
    }

    /// Ack or nack as the README's consumer does for an inbox's answer: processed,
    /// duplicate, stored failure and dead letter are acked; busy and errors are given back.
    pub async fn settle(&self, handled: &Result<Handled, InboxError>) -> Result<(), Interrupted> {
        match handled {
            Ok(Handled::Processed { .. })
            | Ok(Handled::Duplicate { .. })
            | Ok(Handled::Failed { .. })
            | Ok(Handled::DeadLetter { .. }) => self.ack().await,
            Ok(Handled::Busy { .. }) | Err(_) => self.nack().await,
        }
    }

    /// Tell the kit the handler started under `lease` (the [`lease`] consumer does it; a
    /// hand-written consumer calls it first thing in its handler). The lease-mode check
    /// counts effects of queried tables against runs that started their handler.
    pub fn handler_started(&self, lease: &Lease) {
        self.world.entered(&self.actor, lease, false);
    }

    /// Tell the kit this run completed its key inside its own transaction (lease-mode
    /// commits through [`store`](Self::store) are seen by the kit itself).
    pub fn committed_in_tx(&self) {
        self.world.tx_committed(&self.actor);
    }
}

/// A consumer of the broker's deliveries: what the kit runs on each worker. [`lease`],
/// `sqlite_tx` and `postgres_tx` wrap an application's handler; implement it yourself to
/// test a consumer of another shape (the kit's own tests do, for the wrong consumers).
pub trait Consumer: Send + Sync + 'static {
    /// Which guarantee to check.
    fn mode(&self) -> Mode;

    /// Adopt the kit's inbox configuration (called once before the first case). The
    /// default does nothing.
    fn configure(&mut self, config: &InboxConfig) {
        let _ = config;
    }

    /// Consume one delivery: ack or nack it through `cx`.
    fn consume(&self, cx: Cx) -> BoxFuture<'static, Result<(), BoxError>>;
}

impl<C: Consumer + ?Sized> Consumer for Box<C> {
    fn mode(&self) -> Mode {
        (**self).mode()
    }

    fn configure(&mut self, config: &InboxConfig) {
        (**self).configure(config)
    }

    fn consume(&self, cx: Cx) -> BoxFuture<'static, Result<(), BoxError>> {
        (**self).consume(cx)
    }
}

/// A lease-mode consumer: each delivery runs `handler` under [`Inbox::handle`] (with the
/// kit's [`Cx::inbox`]) and is acked or nacked as [`Cx::settle`] says. `handler` gets the
/// message, the lease and the [`Effects`] ledger, and returns the outcome to store.
pub fn lease<H, Fut>(handler: H) -> LeaseConsumer<H>
where
    H: Fn(Message, Lease, Effects) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<Vec<u8>>, BoxError>> + Send + 'static,
{
    LeaseConsumer {
        handler: Arc::new(handler),
    }
}

/// The consumer [`lease`] builds.
pub struct LeaseConsumer<H> {
    handler: Arc<H>,
}

impl<H> std::fmt::Debug for LeaseConsumer<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseConsumer")
    }
}

impl<H, Fut> Consumer for LeaseConsumer<H>
where
    H: Fn(Message, Lease, Effects) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<Vec<u8>>, BoxError>> + Send + 'static,
{
    fn mode(&self) -> Mode {
        Mode::Lease
    }

    fn consume(&self, cx: Cx) -> BoxFuture<'static, Result<(), BoxError>> {
        let handler = Arc::clone(&self.handler);
        Box::pin(async move {
            let key = cx.key();
            let (message, effects) = (cx.message().clone(), cx.effects());
            let handled = cx
                .inbox()
                .handle(&key, None, |lease| {
                    cx.handler_started(&lease);
                    (*handler)(message.clone(), lease, effects.clone())
                })
                .await;
            cx.settle(&handled).await?;
            Ok(())
        })
    }
}
