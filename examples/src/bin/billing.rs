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

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dedup_core::{BoxError, Handled, Inbox, InboxConfig, Key};
use dedup_examples::billing::{self, Payments};
use dedup_examples::report::{print_json, print_table};
use dedup_sqlite::rusqlite::{self, Connection};
use dedup_sqlite::{SqliteStore, TxInbox};

const PAYMENT: Duration = Duration::from_millis(200);
const HANDLERS: usize = 4;
const ORDER: &str = "order-1001";

#[derive(serde::Serialize)]
struct Row {
    variant: &'static str,
    deliveries: usize,
    charges: u32,
    invoices: i64,
}

/// One variant's world: a database file, a payment provider counter.
struct World {
    db: PathBuf,
    charges: AtomicU32,
    /// Idempotency keys the provider has charged under.
    keys: Mutex<HashSet<String>>,
}

impl World {
    /// A fresh database for `variant` (its name, made file-safe, names the file).
    fn new(dir: &Path, variant: &str) -> Result<Arc<Self>, Box<dyn std::error::Error>> {
        let name = variant.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
        let db = dir.join(format!("{name}.db"));
        let conn = connect(&db)?;
        conn.execute_batch(billing::SCHEMA)?;
        conn.execute_batch("CREATE TABLE processed_messages (message_id TEXT PRIMARY KEY);")?;
        Ok(Arc::new(World {
            db,
            charges: AtomicU32::new(0),
            keys: Mutex::default(),
        }))
    }

    fn invoices(&self) -> rusqlite::Result<i64> {
        connect(&self.db)?.query_row("SELECT count(*) FROM invoices", [], |r| r.get(0))
    }

    fn row(&self, variant: &'static str, deliveries: usize) -> rusqlite::Result<Row> {
        Ok(Row {
            variant,
            deliveries,
            charges: self.charges.load(Ordering::SeqCst),
            invoices: self.invoices()?,
        })
    }
}

impl Payments for World {
    /// The payment provider: every call charges the card, but a repeated idempotency key.
    fn charge(&self, _order_id: &str, idempotency_key: Option<&str>) -> Result<(), BoxError> {
        std::thread::sleep(PAYMENT);
        if let Some(key) = idempotency_key
            && !self.keys.lock().expect("lock").insert(key.to_owned())
        {
            return Ok(());
        }
        self.charges.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn connect(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    Ok(conn)
}

/// Run `handler` for each delivery on a pool of [`HANDLERS`] concurrent workers.
async fn deliver<F, Fut>(
    deliveries: &[&'static str],
    handler: F,
) -> Result<(), Box<dyn std::error::Error>>
where
    F: Fn(&'static str) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), Box<dyn std::error::Error + Send + Sync>>> + Send,
{
    let queue = Arc::new(std::sync::Mutex::new(deliveries.to_vec()));
    let mut workers = Vec::new();
    for _ in 0..HANDLERS {
        let (queue, handler) = (Arc::clone(&queue), handler.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let next = queue.lock().expect("lock").pop();
                match next {
                    Some(message_id) => handler(message_id).await?,
                    None => return Ok::<(), Box<dyn std::error::Error + Send + Sync>>(()),
                }
            }
        }));
    }
    for w in workers {
        w.await?.map_err(|e| e.to_string())?;
    }
    Ok(())
}

type BoxResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

async fn naive(dir: &Path) -> Result<Row, Box<dyn std::error::Error>> {
    let world = World::new(dir, "naive")?;
    let w = Arc::clone(&world);
    deliver(&["msg-1", "msg-1"], move |message_id| {
        let w = Arc::clone(&w);
        async move {
            tokio::task::spawn_blocking(move || -> BoxResult {
                let conn = connect(&w.db)?;
                let seen: i64 = conn.query_row(
                    "SELECT count(*) FROM processed_messages WHERE message_id = ?1",
                    [message_id],
                    |r| r.get(0),
                )?;
                if seen == 0 {
                    w.charge(ORDER, None)?;
                    conn.execute(
                        "INSERT INTO invoices VALUES (?1, ?2)",
                        rusqlite::params![ORDER, billing::AMOUNT_CENTS],
                    )?;
                    conn.execute(
                        "INSERT OR IGNORE INTO processed_messages VALUES (?1)",
                        [message_id],
                    )?;
                }
                Ok(())
            })
            .await?
        }
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
    let store = SqliteStore::open(&world.db).await?;
    let inbox = Inbox::new(store).with_config(InboxConfig {
        lease: Duration::from_secs(30),
        ..InboxConfig::default()
    });
    let w = Arc::clone(&world);
    deliver(deliveries, move |message_id| {
        let (w, inbox) = (Arc::clone(&w), inbox.clone());
        async move {
            let key = Key::new("billing", message_id)?;
            let handled = inbox
                .handle(&key, None, |lease| {
                    let w = Arc::clone(&w);
                    async move {
                        tokio::task::spawn_blocking(move || {
                            let conn = connect(&w.db)?;
                            let key = lease.idempotency_key();
                            billing::charge_then_invoice(&conn, &*w, ORDER, Some(&key))
                        })
                        .await?
                    }
                })
                .await?;
            // Busy: a real consumer would nack and the broker redeliver; the redelivery
            // then finds the key completed. Either way the handler does not run again.
            if let Handled::Busy { .. } = handled {}
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
        connect(&world.db)?.execute_batch(billing::NATURAL_KEY)?;
    }
    let inbox = TxInbox::new(SqliteStore::open(&world.db).await?);
    let w = Arc::clone(&world);
    deliver(deliveries, move |message_id| {
        let (w, inbox) = (Arc::clone(&w), inbox.clone());
        async move {
            let key = Key::new("billing", message_id)?;
            let handled = inbox
                .handle(&key, None, move |tx, lease| {
                    // The payment runs inside the transaction: if it fails, the rollback
                    // removes the invoice and leaves the key unprocessed.
                    let key = lease.idempotency_key();
                    billing::invoice_in_tx(tx, &*w, ORDER, natural_key, Some(&key))
                })
                .await?;
            // Busy: as in lease mode, a real consumer nacks; the redelivery then finds the
            // key completed.
            if let Handled::Busy { .. } = handled {}
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
        "OrderPlaced {ORDER} delivered twice, {HANDLERS} concurrent handlers, 200 ms payment call\n"
    );
    let rows = [
        naive(dir).await?,
        lease_mode(dir, &["msg-1", "msg-1"], "dedup, lease mode (Inbox)").await?,
        transactional(
            dir,
            &["msg-1", "msg-1"],
            false,
            "dedup, claim in the invoice transaction",
        )
        .await?,
        lease_mode(
            dir,
            &["msg-1", "msg-2"],
            "two message ids, message-id dedup only",
        )
        .await?,
        transactional(
            dir,
            &["msg-1", "msg-2"],
            true,
            "two message ids, + natural key (order id)",
        )
        .await?,
    ];
    print_table(
        &["variant", "deliveries", "charges", "invoices"],
        &rows
            .iter()
            .map(|r| {
                vec![
                    r.variant.to_string(),
                    r.deliveries.to_string(),
                    r.charges.to_string(),
                    r.invoices.to_string(),
                ]
            })
            .collect::<Vec<_>>(),
    );
    println!(
        "\nThe message id catches redeliveries; only a natural key catches a re-publish under a new id."
    );
    rows.iter().for_each(print_json);
    Ok(())
}
