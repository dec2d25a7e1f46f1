//! The three roles of the story, each a few lines over `dedup-brokers`: the relay, billing
//! (transactional inbox + consumer outbox) and mail (lease-mode inbox). The chaos run calls
//! the same functions in worker processes, with a [`Killer`] at each step.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dedup_brokers::{ConsumerStats, Delivery, Handle, Shutdown, with_inbox};
use dedup_core::outbox::{OutboxRow, OutboxStore, Publisher, Relay, RelayConfig, RelayRound};
use dedup_core::{Backoff, BoxError, Handled, Inbox, InboxConfig, Key, Lease};

use super::broker::{Broker, Lost};
use super::db::Invoice;
use super::{Killer, Names, checkpoint};

/// What every role connects to.
#[derive(Clone, Debug)]
pub struct Ctx {
    /// The store's URL: PostgreSQL or MySQL / MariaDB.
    pub store: String,
    /// The broker and its address.
    pub broker: Broker,
    /// The run's schema and queues (topics).
    pub names: Names,
}

/// Leases of the inboxes: short, so a killed worker's message comes back quickly.
const LEASE: Duration = Duration::from_secs(3);

/// Publish the outbox until `shutdown` (or until the publisher's connection is lost for
/// good: an error, so a supervisor starts the relay again on a fresh connection).
pub async fn relay(
    ctx: &Ctx,
    killer: Option<Killer>,
    shutdown: Shutdown,
) -> Result<RelayRound, BoxError> {
    let store = ctx.names.store(&ctx.store).await?;
    let (inner, lost) = ctx.broker.publisher(&ctx.names).await?;
    let publisher = Checkpointed { inner, killer };
    let outbox: Arc<dyn OutboxStore> = store.outbox();
    let handle = Relay::new(outbox, Arc::new(publisher))
        .with_config(
            RelayConfig::default()
                .batch_size(50)
                .hold(Duration::from_secs(5))
                // Publishers of 3 s (`rabbit.rs`, `kafka.rs`) fit in a 5 s hold with 1 s
                // kept for the marks.
                .mark_margin(Duration::from_secs(1))
                .poll_interval(Duration::from_millis(500))
                // A broker restart fails publishes for a while; rows must not die of it.
                .max_attempts(1000)
                .backoff(Backoff::Interval(Duration::from_millis(300))),
        )
        .start()?;
    let lost = until_shutdown_or_lost(&lost, &shutdown).await;
    let all = handle.stop().await;
    if lost {
        return Err("the broker connection was lost".into());
    }
    Ok(all)
}

/// Consume `OrderPlaced` in a transactional inbox: the invoice, its `InvoiceCreated`
/// message and the inbox record commit together.
pub async fn billing(
    ctx: &Ctx,
    killer: Option<Killer>,
    shutdown: Shutdown,
) -> Result<ConsumerStats, BoxError> {
    let store = ctx.names.store(&ctx.store).await?;
    let billing = store.billing(InboxConfig {
        lease: LEASE,
        ..InboxConfig::default()
    });
    let table = store.table(&ctx.names, "invoices");
    let destination = ctx.broker.destination(&ctx.names.invoices_queue);
    let bill = move |key: Key, delivery: Delivery| {
        let (billing, killer) = (billing.clone(), killer.clone());
        let invoice = Invoice {
            table: table.clone(),
            order_id: order_id(&delivery),
            destination: destination.clone(),
        };
        async move {
            let handled = billing.bill(&key, &invoice, &killer).await;
            if matches!(handled, Ok(Handled::Processed { .. })) {
                checkpoint(&killer, "billing_commit_ack");
            }
            handled
        }
    };
    let queue = &ctx.names.orders_queue;
    ctx.broker.consume(&ctx.names, queue, bill, shutdown).await
}

/// Consume `InvoiceCreated` in the lease-mode inbox: one e-mail per invoice, sent through a
/// provider that honours the lease's idempotency key (so a worker killed between the send
/// and the commit does not send twice when the message comes back).
pub async fn mail(
    ctx: &Ctx,
    killer: Option<Killer>,
    shutdown: Shutdown,
) -> Result<ConsumerStats, BoxError> {
    let store = ctx.names.store(&ctx.store).await?;
    let inbox = Inbox::new(store.dedup()).with_config(InboxConfig {
        lease: LEASE,
        ..InboxConfig::default()
    });
    let (send_killer, names) = (killer.clone(), ctx.names.clone());
    let send = Arc::new(with_inbox(
        inbox,
        move |lease: Lease, delivery: Delivery| {
            let (store, names, killer) = (store.clone(), names.clone(), send_killer.clone());
            async move {
                checkpoint(&killer, "mail_claim_send");
                store
                    .send_mail(&names, &lease.idempotency_key(), &order_id(&delivery))
                    .await?;
                checkpoint(&killer, "mail_send_commit");
                Ok::<_, BoxError>(Some(b"sent".to_vec()))
            }
        },
    ));
    let handler = move |key: Key, delivery: Delivery| {
        let (send, killer) = (Arc::clone(&send), killer.clone());
        async move {
            let handled = send.handle(&key, &delivery).await;
            if matches!(handled, Ok(Handled::Processed { .. })) {
                checkpoint(&killer, "mail_commit_ack");
            }
            handled
        }
    };
    let queue = &ctx.names.invoices_queue;
    ctx.broker
        .consume(&ctx.names, queue, handler, shutdown)
        .await
}

fn order_id(delivery: &Delivery) -> String {
    let order: serde_json::Value = serde_json::from_slice(&delivery.payload).unwrap_or_default();
    order["order_id"].as_str().unwrap_or_default().to_owned()
}

async fn until_shutdown_or_lost(lost: &Lost, shutdown: &Shutdown) -> bool {
    loop {
        tokio::select! {
            () = shutdown.wait() => return false,
            () = tokio::time::sleep(Duration::from_millis(200)) => {
                if lost() {
                    return true;
                }
            }
        }
    }
}

/// The relay's publisher, with a kill point after the take (nothing published yet) and
/// one after the broker confirmed a batch (not yet marked sent).
struct Checkpointed {
    inner: Arc<dyn Publisher>,
    killer: Option<Killer>,
}

impl std::fmt::Debug for Checkpointed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpointed")
            .field("publisher", &self.inner.name())
            .field("killer", &self.killer)
            .finish()
    }
}

#[async_trait]
impl Publisher for Checkpointed {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn delivery_timeout(&self) -> std::time::Duration {
        self.inner.delivery_timeout()
    }

    async fn publish(&self, row: &OutboxRow) -> Result<(), BoxError> {
        self.inner.publish(row).await
    }

    async fn publish_all(&self, rows: &[OutboxRow]) -> Vec<Result<(), BoxError>> {
        checkpoint(&self.killer, "relay_take_publish");
        let results = self.inner.publish_all(rows).await;
        if results.iter().all(Result::is_ok) {
            checkpoint(&self.killer, "relay_publish_mark");
        }
        results
    }
}
