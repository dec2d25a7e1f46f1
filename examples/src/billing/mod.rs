//! The billing consumer's parts, shared by the `billing` program and the test kit's tests
//! (`testkit/tests/billing.rs`): the invoice table, the payment provider as the handlers
//! see it, and the three handlers (naive, lease mode and transactional). The program's
//! world and handler pool are in [`world`] and [`pool`].

pub mod pool;
pub mod world;

use dedup_core::BoxError;
use dedup_sqlite::rusqlite::{Connection, Transaction, params};

/// What every invoice charges.
pub const AMOUNT_CENTS: i64 = 4999;

/// The invoice table (no unique order id: [`NATURAL_KEY`] adds one).
pub const SCHEMA: &str =
    "CREATE TABLE IF NOT EXISTS invoices (order_id TEXT NOT NULL, amount_cents INTEGER NOT NULL);";

/// A unique order id on the invoice table: the natural key that catches an order
/// re-published under a new message id.
pub const NATURAL_KEY: &str =
    "CREATE UNIQUE INDEX IF NOT EXISTS invoices_order ON invoices (order_id)";

/// The naive consumer's table of processed message ids.
pub const NAIVE_SCHEMA: &str =
    "CREATE TABLE IF NOT EXISTS processed_messages (message_id TEXT PRIMARY KEY);";

/// The payment provider, as the handlers call it (synchronously: they run on a blocking
/// thread or inside an SQLite transaction).
pub trait Payments {
    /// Charge for `order_id`. With an idempotency key, a provider that honours keys (as
    /// Stripe-like APIs do) charges once per key and answers repeats without charging.
    fn charge(&self, order_id: &str, idempotency_key: Option<&str>) -> Result<(), BoxError>;
}

/// The naive consumer: check the processed-messages table, charge, write the invoice,
/// mark the message processed. Two handlers running it at once for the same message both
/// see "not processed", and both charge.
pub fn check_then_act(
    conn: &Connection,
    payments: &impl Payments,
    order_id: &str,
    message_id: &str,
) -> Result<(), BoxError> {
    let seen: i64 = conn.query_row(
        "SELECT count(*) FROM processed_messages WHERE message_id = ?1",
        [message_id],
        |r| r.get(0),
    )?;
    if seen == 0 {
        payments.charge(order_id, None)?;
        conn.execute(
            "INSERT INTO invoices VALUES (?1, ?2)",
            params![order_id, AMOUNT_CENTS],
        )?;
        conn.execute(
            "INSERT OR IGNORE INTO processed_messages VALUES (?1)",
            [message_id],
        )?;
    }
    Ok(())
}

/// Lease mode: charge, then write the invoice on `conn` (its own autocommit statement).
/// Runs under `Inbox::handle`; pass `lease.idempotency_key()` so a retry after a crash
/// between the charge and the commit does not charge again.
pub fn charge_then_invoice(
    conn: &Connection,
    payments: &impl Payments,
    order_id: &str,
    idempotency_key: Option<&str>,
) -> Result<Option<Vec<u8>>, BoxError> {
    payments.charge(order_id, idempotency_key)?;
    conn.execute(
        "INSERT INTO invoices VALUES (?1, ?2)",
        params![order_id, AMOUNT_CENTS],
    )?;
    Ok(Some(b"invoiced".to_vec()))
}

/// Transactional mode: write the invoice in `tx` (insert-or-ignore when the table has the
/// [`NATURAL_KEY`]) and charge when it was new. The invoice commits with the key's
/// completion; the charge does not (the provider is not in the transaction): a crash
/// between the charge and the commit rolls the invoice back but not the charge, so the
/// retry charges again unless the provider gets `lease.idempotency_key()`.
pub fn invoice_in_tx(
    tx: &Transaction<'_>,
    payments: &impl Payments,
    order_id: &str,
    natural_key: bool,
    idempotency_key: Option<&str>,
) -> Result<Option<Vec<u8>>, BoxError> {
    let insert = if natural_key {
        "INSERT OR IGNORE INTO invoices VALUES (?1, ?2)"
    } else {
        "INSERT INTO invoices VALUES (?1, ?2)"
    };
    if tx.execute(insert, params![order_id, AMOUNT_CENTS])? == 1 {
        payments.charge(order_id, idempotency_key)?;
    }
    Ok(Some(b"invoiced".to_vec()))
}
