//! Every effects query is checked, whatever the order they were registered in: a handler
//! on SQLite writes three effects (an audit row, an invoice, an event); the right one
//! writes all three in its transaction and passes, the broken one writes the audit row on
//! another connection, outside the transaction, and is caught, with the broken effect
//! registered first, second or third.

use std::sync::Arc;

use dedup_core::DedupStore;
use dedup_sqlite::rusqlite::params;
use dedup_sqlite::{SqliteConfig, TxInbox};
use dedup_testkit::{Failure, Kit, Report, Subject, sqlite_tx};
mod sqlite_counts;
mod three_effects;

use sqlite_counts::{connect, count};
use three_effects::{BROKEN, ORDERS, audit_repeated, register};

const EFFECTS_TABLE: &str = "CREATE TABLE fx (kind TEXT NOT NULL, order_id TEXT NOT NULL)";

/// Run the three-effect handler with the effects registered in `order`. `broken`: the
/// audit row goes to another database file on its own connection, committed at once.
fn run(order: [&'static str; 3], broken: bool, cases: u32) -> Result<Report, Box<Failure>> {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let (app, side) = (dir.path().join("app.db"), dir.path().join("side.db"));
    for db in [&app, &side] {
        connect(db)
            .and_then(|c| Ok(c.execute_batch(EFFECTS_TABLE)?))
            .expect("the effects table");
    }
    let audit_db = if broken { side.clone() } else { app.clone() };
    let kit = register(Kit::new().cases(cases), order, |kind| {
        let db = if kind == BROKEN { &audit_db } else { &app };
        count(db.clone(), "fx", format!("kind = '{kind}'"))
    });
    let path = app.clone();
    kit.run_with(|setup| async move {
        let store = setup.sqlite(&path, SqliteConfig::default()).await?;
        Ok(Subject {
            store: Arc::new(store.clone()) as Arc<dyn DedupStore>,
            consumer: sqlite_tx(TxInbox::new(store), move |tx, _lease, message, _fx| {
                let insert = "INSERT INTO fx VALUES (?1, ?2)";
                if broken {
                    connect(&side)?.execute(insert, params![BROKEN, message.id()])?;
                } else {
                    tx.execute(insert, params![BROKEN, message.id()])?;
                }
                for kind in ["invoice", "event"] {
                    tx.execute(insert, params![kind, message.id()])?;
                }
                Ok(Some(b"done".to_vec()))
            }),
        })
    })
}

#[test]
fn three_effects_in_the_transaction_pass_on_sqlite() {
    let report = run(ORDERS[0], false, 64).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(report.runs, 64, "{report:?}");
}

#[test]
fn one_effect_outside_the_transaction_is_caught_in_any_registration_order_on_sqlite() {
    for order in ORDERS {
        let f = run(order, true, 64).expect_err("the repeated audit row must be caught");
        audit_repeated(&f, order);
    }
}
