//! One variant's world in the `billing` program: its own SQLite file and a payment
//! provider that counts the charges it makes.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dedup_core::BoxError;
use dedup_sqlite::rusqlite::{self, Connection};

use super::{NAIVE_SCHEMA, Payments, SCHEMA};
use crate::report::{print_json, print_table};

/// How long the payment provider takes per call.
pub const PAYMENT: Duration = Duration::from_millis(200);

/// One variant's outcome, printed as a table row and a JSON line.
#[derive(serde::Serialize)]
pub struct Row {
    /// What the variant does.
    pub variant: &'static str,
    /// Deliveries handed to the handlers.
    pub deliveries: usize,
    /// Charges the payment provider made.
    pub charges: u32,
    /// Invoices written.
    pub invoices: i64,
}

/// One variant's world: a database file, a payment provider counter.
pub struct World {
    /// The variant's SQLite file.
    pub db: PathBuf,
    charges: AtomicU32,
    /// Idempotency keys the provider has charged under.
    keys: Mutex<HashSet<String>>,
}

impl World {
    /// A fresh database for `variant` (its name, made file-safe, names the file).
    pub fn new(dir: &Path, variant: &str) -> Result<Arc<Self>, Box<dyn std::error::Error>> {
        let name = variant.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
        let db = dir.join(format!("{name}.db"));
        let conn = connect(&db)?;
        conn.execute_batch(SCHEMA)?;
        conn.execute_batch(NAIVE_SCHEMA)?;
        Ok(Arc::new(World {
            db,
            charges: AtomicU32::new(0),
            keys: Mutex::default(),
        }))
    }

    /// A new connection to the variant's database.
    pub fn connect(&self) -> rusqlite::Result<Connection> {
        connect(&self.db)
    }

    /// Run `f` on a blocking thread with a new connection and the world (the handlers
    /// talk to SQLite and to the provider synchronously).
    pub fn blocking<T, F>(
        self: &Arc<Self>,
        f: F,
    ) -> impl Future<Output = Result<T, BoxError>> + use<T, F>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &World) -> Result<T, BoxError> + Send + 'static,
    {
        let world = Arc::clone(self);
        async move { tokio::task::spawn_blocking(move || f(&world.connect()?, &world)).await? }
    }

    /// The variant's outcome: charges made and invoices written.
    pub fn row(&self, variant: &'static str, deliveries: usize) -> rusqlite::Result<Row> {
        let invoices = self
            .connect()?
            .query_row("SELECT count(*) FROM invoices", [], |r| r.get(0))?;
        Ok(Row {
            variant,
            deliveries,
            charges: self.charges.load(Ordering::SeqCst),
            invoices,
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

/// Print the variants' outcomes as a table, then each as a JSON line.
pub fn print_rows(rows: &[Row]) {
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
}
