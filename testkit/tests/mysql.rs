//! The billing consumer's transactional shape on MySQL / MariaDB (`TxInbox` over a
//! `MySqlStore` on the kit's clock): the invoice written in the handler's transaction, the
//! charge passed the lease's idempotency key. Restated here in sqlx (the example's
//! handlers are SQLite's). Needs `DEDUP_MYSQL_URL`; skips without it, fails under
//! `DEDUP_TEST_STRICT=1`.

use std::collections::BTreeMap;
use std::sync::Arc;

use dedup_core::{BoxError, DedupStore};
use dedup_mysql::sqlx::{self, AssertSqlSafe, MySqlPool};
use dedup_mysql::{MySqlConfig, TxInbox};
mod sql_billing;

use dedup_testkit::{Kit, Subject, mysql_tx};

/// The invoices table of a test: one per test, as the two run at once.
fn invoices(with_key: bool) -> &'static str {
    if with_key {
        "dedup_testkit_invoices"
    } else {
        "dedup_testkit_invoices_nokey"
    }
}

async fn invoices_table(pool: &MySqlPool, table: &str) -> Result<(), BoxError> {
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {table} (order_id VARCHAR(255) NOT NULL, amount_cents BIGINT NOT NULL) ENGINE = InnoDB"
    )))
    .execute(pool)
    .await?;
    Ok(())
}

fn run(
    with_key: bool,
    cases: u32,
) -> Option<Result<dedup_testkit::Report, Box<dedup_testkit::Failure>>> {
    let url = dedup_conformance::server_url("DEDUP_MYSQL_URL")?;
    let table = invoices(with_key);
    let pool: Arc<std::sync::OnceLock<MySqlPool>> = Arc::default();
    let query_pool = Arc::clone(&pool);
    Some(
        Kit::new()
            .cases(cases)
            .expect_effect("charge")
            .effects_query("invoice", move |ids: Vec<String>| {
                let pool = query_pool.get().cloned();
                async move {
                    let pool = pool.ok_or("no pool")?;
                    if ids.is_empty() {
                        return Ok(BTreeMap::new());
                    }
                    let marks = vec!["?"; ids.len()].join(", ");
                    let sql = format!(
                        "SELECT order_id, CAST(count(*) AS SIGNED) FROM {table} \
                         WHERE order_id IN ({marks}) GROUP BY order_id"
                    );
                    let mut query = sqlx::query_as::<_, (String, i64)>(AssertSqlSafe(sql));
                    for id in &ids {
                        query = query.bind(id);
                    }
                    let rows = query.fetch_all(&pool).await?;
                    Ok::<_, BoxError>(
                        rows.into_iter()
                            .map(|(id, n)| (id, n as usize))
                            .collect::<BTreeMap<_, _>>(),
                    )
                }
            })
            .expect("each effect has its own name")
            .run_with(|setup| async move {
                let store = setup.mysql(&url, MySqlConfig::default()).await?;
                invoices_table(store.pool(), table).await?;
                let _ = pool.set(store.pool().clone());
                Ok(Subject {
                    store: Arc::new(store.clone()) as Arc<dyn DedupStore>,
                    consumer: mysql_tx(TxInbox::new(store), move |conn, lease, message, fx| {
                        Box::pin(async move {
                            let inserted = sqlx::query(AssertSqlSafe(format!(
                                "INSERT INTO {table} VALUES (?, 4999)"
                            )))
                            .bind(message.id())
                            .execute(&mut *conn)
                            .await?;
                            sql_billing::charge(fx, lease, inserted.rows_affected() == 1, with_key)
                                .await
                        })
                    }),
                })
            }),
    )
}

#[test]
fn billing_in_transactional_mode_passes_on_mysql() {
    sql_billing::passes(run(true, 256), "DEDUP_MYSQL_URL", "MySQL / MariaDB");
}

#[test]
fn a_charge_outside_the_transaction_is_caught_on_mysql() {
    sql_billing::repeated_charge_is_caught(run(false, 256), "DEDUP_MYSQL_URL");
}
