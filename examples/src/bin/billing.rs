//! Billing: the double-charged invoice.
//!
//! An `OrderPlaced` event (one message id) is delivered twice and picked up by two of four
//! concurrent handlers; each handler calls a payment provider (200 ms, not idempotent) and
//! writes an invoice. Variants, each on a fresh SQLite database:
//!
//! 1. naive: `SELECT` from a processed-messages table, pay, insert the invoice, mark
//!    processed: both handlers see "not processed" and both charge.
//! 2. dedup, lease mode: `Inbox::handle` claims the message id; the second handler gets
//!    busy / duplicate and does nothing.
//! 3. dedup, transactional (`TxInbox`): the handler runs in the SQLite transaction that
//!    completes the key, so the inbox row and the invoice commit (or roll back) together.
//! 4. the same order published twice under two different message ids: message-id dedup
//!    cannot know they are the same order; a natural key (a unique order id on the invoice
//!    table, insert-or-ignore before paying) catches it. Both layers are needed.
//!
//! The handlers (`dedup_examples::billing`) pass the lease's idempotency key to the payment
//! provider, which honours it: without it a worker that dies between the charge and the
//! commit charges again on the retry, in both modes (the test kit's billing tests show it).

use std::path::Path;
use std::time::Duration;

use dedup_core::{Inbox, InboxConfig, Key};
use dedup_examples::billing;
use dedup_examples::billing::pool::deliver;
use dedup_examples::billing::world::{self, Row, World};
use dedup_sqlite::{SqliteStore, TxInbox};

const HANDLERS: usize = 4;
const ORDER: &str = "order-1001";
/// The same message delivered twice.
const REDELIVERED: [&str; 2] = ["msg-1", "msg-1"];
/// The same order published twice, under two message ids.
const REPUBLISHED: [&str; 2] = ["msg-1", "msg-2"];

async fn naive(dir: &Path) -> Result<Row, Box<dyn std::error::Error>> {
    let world = World::new(dir, "naive")?;
    deliver(&world, &REDELIVERED, HANDLERS, |w, message_id| {
        w.blocking(move |conn, w| billing::check_then_act(conn, w, ORDER, message_id))
    })
    .await?;
    Ok(world.row("naive check-then-act", 2)?)
}

async fn lease_mode(
    dir: &Path,
    deliveries: &[&'static str],
    variant: &'static str,
) -> Result<Row, Box<dyn std::error::Error>> {
    let world = World::new(dir, variant)?;
    let inbox = Inbox::new(SqliteStore::open(&world.db).await?).with_config(InboxConfig {
        lease: Duration::from_secs(30),
        ..InboxConfig::default()
    });
    deliver(&world, deliveries, HANDLERS, move |w, message_id| {
        let inbox = inbox.clone();
        async move {
            let key = Key::new("billing", message_id)?;
            // Busy: a real consumer would nack and the broker redeliver; the redelivery
            // then finds the key completed. Either way the handler does not run again.
            inbox
                .handle(&key, None, |lease| {
                    let key = lease.idempotency_key();
                    w.blocking(move |conn, w| {
                        billing::charge_then_invoice(conn, w, ORDER, Some(&key))
                    })
                })
                .await?;
            Ok(())
        }
    })
    .await?;
    Ok(world.row(variant, deliveries.len())?)
}

/// The transactional inbox (`TxInbox`): the invoice, the payment call and the key's
/// completion run in one SQLite transaction, so the inbox row and the invoice commit (or
/// roll back) together. With `natural_key`, the invoice insert is an insert-or-ignore on the
/// order id, done before paying.
async fn transactional(
    dir: &Path,
    deliveries: &[&'static str],
    natural_key: bool,
    variant: &'static str,
) -> Result<Row, Box<dyn std::error::Error>> {
    let world = World::new(dir, variant)?;
    if natural_key {
        world.connect()?.execute_batch(billing::NATURAL_KEY)?;
    }
    let inbox = TxInbox::new(SqliteStore::open(&world.db).await?);
    deliver(&world, deliveries, HANDLERS, move |w, message_id| {
        let inbox = inbox.clone();
        async move {
            let key = Key::new("billing", message_id)?;
            // Busy is left to the broker, as in lease mode.
            inbox
                .handle(&key, None, move |tx, lease| {
                    // The payment runs inside the transaction: if it fails, the rollback
                    // removes the invoice and leaves the key unprocessed.
                    let key = lease.idempotency_key();
                    billing::invoice_in_tx(tx, &*w, ORDER, natural_key, Some(&key))
                })
                .await?;
            Ok(())
        }
    })
    .await?;
    Ok(world.row(variant, deliveries.len())?)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dedup_examples::exit::report(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    println!(
        "OrderPlaced {ORDER} delivered twice, {HANDLERS} concurrent handlers, {} ms payment call\n",
        world::PAYMENT.as_millis()
    );
    let rows = [
        naive(dir).await?,
        lease_mode(dir, &REDELIVERED, "dedup, lease mode (Inbox)").await?,
        transactional(
            dir,
            &REDELIVERED,
            false,
            "dedup, claim in the invoice transaction",
        )
        .await?,
        lease_mode(dir, &REPUBLISHED, "two message ids, message-id dedup only").await?,
        transactional(
            dir,
            &REPUBLISHED,
            true,
            "two message ids, + natural key (order id)",
        )
        .await?,
    ];
    world::print_rows(&rows);
    Ok(())
}
