//! The billing consumer's transactional shape on PostgreSQL (`TxInbox` over a
//! `PostgresStore` on the kit's clock): the invoice written in the handler's transaction,
//! the charge passed the lease's idempotency key. Restated here in sqlx (the example's
//! handlers are SQLite's). Needs `DEDUP_POSTGRES_URL`; skips without it, fails under
//! `DEDUP_TEST_STRICT=1`.

use std::collections::BTreeMap;
use std::sync::Arc;

use dedup_core::{BoxError, DedupStore};
use dedup_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use dedup_postgres::{PostgresConfig, TxInbox};
mod sql_billing;

use dedup_testkit::{Kit, Subject, postgres_tx};

/// The schema of a test's tables (the store's and the invoices): one per test, as the two
/// run at once.
fn schema(with_key: bool) -> &'static str {
    if with_key {
        "dedup_testkit_billing"
    } else {
        "dedup_testkit_billing_nokey"
    }
}

async fn invoices_table(pool: &PgPool, schema: &str) -> Result<(), BoxError> {
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {schema}.invoices (order_id TEXT NOT NULL, amount_cents BIGINT NOT NULL)"
    )))
    .execute(pool)
    .await?;
    Ok(())
}

fn run(
    with_key: bool,
    cases: u32,
) -> Option<Result<dedup_testkit::Report, Box<dedup_testkit::Failure>>> {
    let url = dedup_conformance::server_url("DEDUP_POSTGRES_URL")?;
    let schema = schema(with_key);
    let pool: Arc<std::sync::OnceLock<PgPool>> = Arc::default();
    let query_pool = Arc::clone(&pool);
    Some(
        Kit::new()
            .cases(cases)
            .expect_effect("charge")
            .effects_query("invoice", move |ids: Vec<String>| {
                let pool = query_pool.get().cloned();
                async move {
                    let pool = pool.ok_or("no pool")?;
                    let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
                        "SELECT order_id, count(*) FROM {schema}.invoices WHERE order_id = ANY($1) GROUP BY order_id"
                    )))
                    .bind(&ids)
                    .fetch_all(&pool)
                    .await?;
                    Ok::<_, BoxError>(
                        rows.into_iter()
                            .map(|(id, n)| (id, n as usize))
                            .collect::<BTreeMap<_, _>>(),
                    )
                }
            })
            .expect("each effect has its own name")
            .run_with(|setup| async move {
                let store = setup
                    .postgres(
                        &url,
                        PostgresConfig {
                            schema: schema.into(),
                            ..PostgresConfig::default()
                        },
                    )
                    .await?;
                invoices_table(store.pool(), schema).await?;
                let _ = pool.set(store.pool().clone());
                Ok(Subject {
                    store: Arc::new(store.clone()) as Arc<dyn DedupStore>,
                    consumer: postgres_tx(TxInbox::new(store), move |conn, lease, message, fx| {
                        Box::pin(async move {
                            let inserted = sqlx::query(AssertSqlSafe(format!(
                                "INSERT INTO {schema}.invoices VALUES ($1, 4999)"
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
fn billing_in_transactional_mode_passes_on_postgres() {
    sql_billing::passes(run(true, 256), "DEDUP_POSTGRES_URL", "PostgreSQL");
}

#[test]
fn a_charge_outside_the_transaction_is_caught_on_postgres() {
    sql_billing::repeated_charge_is_caught(run(false, 256), "DEDUP_POSTGRES_URL");
}
