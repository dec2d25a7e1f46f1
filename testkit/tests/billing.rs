//! The billing consumer of `examples/` (its handlers are `dedup_examples::billing`, the
//! ones the `billing` program runs) under the kit, on a real SQLite file: the store's
//! table and the application's `invoices` table in one database, as in the program.
//! Effects: the payment provider's charges (the kit's ledger, through `Payments`) and
//! the invoices (counted in the application's table).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dedup_core::{BoxError, DedupStore};
use dedup_examples::billing::{self, Payments};
use dedup_sqlite::{SqliteConfig, SqliteStore, TxInbox};
use dedup_testkit::{Effects, Kit, Setup, Subject, Violation, lease, sqlite_tx};
mod sqlite_counts;

use sqlite_counts::connect;

/// The payment provider as the kit's ledger: each charge is a stopping point and an
/// effect, applied once per idempotency key.
struct Provider<'a>(&'a Effects);

impl Payments for Provider<'_> {
    fn charge(&self, _order_id: &str, idempotency_key: Option<&str>) -> Result<(), BoxError> {
        match idempotency_key {
            Some(key) => self.0.call_with_key_blocking("charge", key)?,
            None => self.0.call_blocking("charge")?,
        }
        Ok(())
    }
}

/// A fresh database file with the invoice table.
fn database() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let db = dir.path().join("billing.db");
    connect(&db)
        .and_then(|c| Ok(c.execute_batch(billing::SCHEMA)?))
        .expect("the invoice table");
    (dir, db)
}

/// Invoices per order id (the message id), for the kit's effects query.
fn invoices(
    db: PathBuf,
) -> impl Fn(
    Vec<String>,
) -> futures::future::Ready<Result<std::collections::BTreeMap<String, usize>, BoxError>>
+ Send
+ Sync
+ 'static {
    sqlite_counts::count(db, "invoices", "TRUE".into())
}

/// The kit's store in the application's database file (on the kit's own tables).
async fn store(db: &Path, setup: Setup) -> Result<SqliteStore, BoxError> {
    Ok(setup.sqlite(db, SqliteConfig::default()).await?)
}

#[test]
fn billing_in_lease_mode_passes_on_sqlite() {
    let (_dir, db) = database();
    let path = db.clone();
    let report = Kit::new()
        .cases(256)
        .expect_effect("charge")
        .effects_query("invoice", invoices(db.clone()))
        .expect("each effect has its own name")
        .check_with(|setup| async move {
            let store = store(&path, setup).await?;
            let db = path.clone();
            Ok(Subject {
                store: Arc::new(store) as Arc<dyn DedupStore>,
                consumer: lease(move |message, lease, fx| {
                    let db = db.clone();
                    async move {
                        tokio::task::spawn_blocking(move || {
                            let conn = connect(&db)?;
                            let key = lease.idempotency_key();
                            billing::charge_then_invoice(
                                &conn,
                                &Provider(&fx),
                                message.id(),
                                Some(&key),
                            )
                        })
                        .await?
                    }
                }),
            })
        });
    // It passes the lease rule. The report's excused repeats are second invoices: a kill
    // after the invoice and before the commit, then the retry writes it again (the
    // charge itself is keyed and never repeats); transactional mode has none.
    eprintln!("billing, lease mode, SQLite: {report:?}");
}

/// The billing consumer in transactional mode, with or without the idempotency key on the
/// charge.
fn billing_tx(
    cases: u32,
    with_key: bool,
) -> Result<dedup_testkit::Report, Box<dedup_testkit::Failure>> {
    let (_dir, db) = database();
    let path = db.clone();
    Kit::new()
        .cases(cases)
        .expect_effect("charge")
        .effects_query("invoice", invoices(db.clone()))
        .expect("each effect has its own name")
        .run_with(|setup| async move {
            let store = store(&path, setup).await?;
            Ok(Subject {
                store: Arc::new(store.clone()) as Arc<dyn DedupStore>,
                consumer: sqlite_tx(TxInbox::new(store), move |tx, lease, message, fx| {
                    let key = lease.idempotency_key();
                    let key = with_key.then_some(key.as_str());
                    billing::invoice_in_tx(tx, &Provider(fx), message.id(), false, key)
                }),
            })
        })
}

#[test]
fn billing_in_transactional_mode_passes_on_sqlite() {
    let report = billing_tx(256, true).unwrap_or_else(|f| panic!("{f}"));
    eprintln!("billing, transactional mode, SQLite: {report:?}");
    // Every window was hit by some kill: before the claim, inside the transaction before
    // the charge and before the commit, between the commit and the ack.
    for window in [
        "before the claim",
        "before effect \"charge\"",
        "before the transaction's commit",
        "before the ack",
    ] {
        assert!(report.kills.contains_key(window), "{window}: {report:?}");
    }
}

#[test]
fn a_charge_outside_the_transaction_without_the_key_is_caught_in_transactional_mode() {
    // The charge runs inside the handler but is not part of the transaction: a worker that
    // dies after it and before the commit rolls the invoice back, not the charge.
    let f = billing_tx(256, false).expect_err("the repeated charge must be caught");
    eprintln!("{f}");
    assert!(f.reproduced, "{f}");
    assert_eq!(
        f.violations,
        vec![Violation::EffectRepeated {
            message: "m0".into(),
            effect: "charge".into(),
            times: 2,
            excused: 0,
        }],
        "{f}"
    );
    assert_eq!((f.schedule.messages, f.schedule.workers), (1, 1), "{f}");
    assert_eq!(f.schedule.kills() + f.schedule.failures(), 1, "{f}");
    let s = f.story.join("\n");
    assert!(
        s.contains("w0: dies before the transaction's commit")
            || s.contains("w0: the transaction's commit for m0 fails (injected)"),
        "{s}"
    );
    // The invoice itself was rolled back with the transaction: one, not two.
    assert!(!s.contains("repeated: effect \"invoice\""), "{f}");
}
