//! The billing consumer's transactional shape on PostgreSQL (`TxInbox` over a
//! `PostgresStore` on the kit's clock): the invoice written in the handler's transaction,
//! the charge passed the lease's idempotency key. Restated here in sqlx (the example's
//! handlers are SQLite's). Then the kit's tables all gone after a run. Needs
//! `DEDUP_POSTGRES_URL`; skips without it, fails under `DEDUP_TEST_STRICT=1`.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use dedup_core::outbox::OutboxMessage;
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
                    consumer: postgres_tx(own_tx(store), move |conn, lease, message, fx| {
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

/// How many tables of any schema are named with `prefix`, and whether `schema` has a
/// versions table.
async fn named_with(pool: &PgPool, schema: &str, prefix: &str) -> (i64, bool) {
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables WHERE starts_with(table_name::text, $1)",
    )
    .bind(prefix)
    .fetch_one(pool)
    .await
    .expect("the tables");
    let versions: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM information_schema.tables \
         WHERE table_schema = $1 AND table_name = 'dedup_schema_versions')",
    )
    .bind(schema)
    .fetch_one(pool)
    .await
    .expect("the versions table");
    (tables, versions)
}

#[test]
fn a_run_leaves_no_table_of_its_own_on_postgres() {
    let Some(url) = dedup_conformance::server_url("DEDUP_POSTGRES_URL") else {
        eprintln!("SKIPPED: DEDUP_POSTGRES_URL is not set");
        return;
    };
    let schema = format!("dedup_testkit_nonce_{}", std::process::id());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let admin = rt.block_on(async {
        let admin = PgPool::connect(&url).await.expect("a pool");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE; CREATE SCHEMA \"{schema}\""
        )))
        .execute(&admin)
        .await
        .expect("a fresh schema");
        admin
    });
    // The run's tables as the setup saw them: their prefix, and what was there.
    let seen: Arc<OnceLock<(String, (i64, bool))>> = Arc::default();
    let during = Arc::clone(&seen);
    let in_schema = schema.clone();
    let report = Kit::new()
        .cases(16)
        .run_with(|setup| async move {
            let store = setup
                .postgres(
                    &url,
                    PostgresConfig {
                        schema: in_schema.clone(),
                        ..PostgresConfig::default()
                    },
                )
                .await?;
            let prefix = setup.inbox_table().to_owned();
            let found = named_with(store.pool(), &in_schema, &prefix).await;
            let _ = during.set((prefix, found));
            let outbox = store.outbox();
            Ok(Subject {
                store: Arc::new(store.clone()) as Arc<dyn DedupStore>,
                // Each message also puts an event in the outbox.
                consumer: postgres_tx(TxInbox::new(store), move |conn, _lease, message, _fx| {
                    let outbox = outbox.clone();
                    Box::pin(async move {
                        let event = OutboxMessage::new("events", message.id(), b"{}".to_vec())?;
                        outbox.enqueue(&mut *conn, &[event]).await?;
                        Ok(None)
                    })
                }),
            })
        })
        .unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(report.runs, 16, "{report:?}");
    let (prefix, during) = seen.get().cloned().expect("the setup ran");
    // The records and the outbox, in a schema the kit made the versions table of.
    assert_eq!(during, (2, true), "{prefix}");
    let after = rt.block_on(named_with(&admin, &schema, &prefix));
    rt.block_on(
        sqlx::query(AssertSqlSafe(format!("DROP SCHEMA \"{schema}\" CASCADE"))).execute(&admin),
    )
    .expect("dropping the test schema");
    assert_eq!(
        after,
        (0, false),
        "{prefix}: tables left, and the versions table"
    );
}

/// The inbox as a service builds it behind a broker consumer: each run's transaction
/// begun by the service's own closure (`with_begin`; here it sets the isolation level), so
/// the billing runs check that production path: begun, committed, rolled back and
/// retried on conflicts by the inbox.
fn own_tx(store: dedup_postgres::PostgresStore) -> TxInbox {
    let pool = store.pool().clone();
    TxInbox::new(store).with_begin(move || {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await?;
            sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                .execute(&mut *tx)
                .await?;
            Ok(tx)
        }
    })
}
