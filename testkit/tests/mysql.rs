//! The billing consumer's transactional shape on MySQL / MariaDB (`TxInbox` over a
//! `MySqlStore` on the kit's clock): the invoice written in the handler's transaction, the
//! charge passed the lease's idempotency key. Restated here in sqlx (the example's
//! handlers are SQLite's). Then three effects, each its own query, one of them written
//! outside the transaction; and the kit's tables all gone after a run. Needs
//! `DEDUP_MYSQL_URL`; skips without it, fails under `DEDUP_TEST_STRICT=1`.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use dedup_core::outbox::OutboxMessage;
use dedup_core::{BoxError, DedupStore};
use dedup_mysql::sqlx::{self, AssertSqlSafe, MySqlPool};
use dedup_mysql::{MySqlConfig, PURGE_RUNS_TABLE, SCHEMA_VERSIONS_TABLE, TxInbox};
mod sql_billing;
mod three_effects;

use dedup_testkit::{Failure, Kit, Report, Subject, mysql_tx};
use three_effects::{BROKEN, ORDERS, audit_repeated, register};

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
    url_var: &str,
) -> Option<Result<dedup_testkit::Report, Box<dedup_testkit::Failure>>> {
    let url = dedup_conformance::server_url(url_var)?;
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
                    consumer: mysql_tx(own_tx(store), move |conn, lease, message, fx| {
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
    sql_billing::passes(
        run(true, 256, "DEDUP_MYSQL_URL"),
        "DEDUP_MYSQL_URL",
        "MySQL / MariaDB",
    );
}

/// The same kit run on a node of the Galera cluster: the kit's tables and the store's
/// are created there and replicated to the others.
#[test]
fn billing_in_transactional_mode_passes_on_galera() {
    sql_billing::passes(
        run(true, 64, "DEDUP_GALERA_URL"),
        "DEDUP_GALERA_URL",
        "MariaDB Galera",
    );
}

#[test]
fn a_charge_outside_the_transaction_is_caught_on_galera() {
    sql_billing::repeated_charge_is_caught(run(false, 64, "DEDUP_GALERA_URL"), "DEDUP_GALERA_URL");
}

#[test]
fn a_charge_outside_the_transaction_is_caught_on_mysql() {
    sql_billing::repeated_charge_is_caught(run(false, 256, "DEDUP_MYSQL_URL"), "DEDUP_MYSQL_URL");
}

/// How many rows of `kind` each message has in `table`, once the setup has set `pool`.
fn count_effect(
    pool: Arc<OnceLock<MySqlPool>>,
    table: String,
    kind: &'static str,
) -> impl Fn(
    Vec<String>,
) -> futures::future::BoxFuture<'static, Result<BTreeMap<String, usize>, BoxError>>
+ Send
+ Sync
+ 'static {
    move |ids: Vec<String>| {
        let (pool, table) = (pool.get().cloned(), table.clone());
        Box::pin(async move {
            let pool = pool.ok_or("no pool")?;
            let marks = vec!["?"; ids.len()].join(", ");
            let sql = format!(
                "SELECT order_id, CAST(count(*) AS SIGNED) FROM {table} \
                 WHERE kind = '{kind}' AND order_id IN ({marks}) GROUP BY order_id"
            );
            let mut query = sqlx::query_as::<_, (String, i64)>(AssertSqlSafe(sql));
            for id in &ids {
                query = query.bind(id);
            }
            let rows = query.fetch_all(&pool).await?;
            Ok(rows.into_iter().map(|(id, n)| (id, n as usize)).collect())
        })
    }
}

/// Run a handler writing three effects into `table` with them registered in `order`.
/// `broken`: the audit row goes in on another connection of the pool, outside the
/// transaction (committed at once).
fn three_effects(
    url: &str,
    table: &str,
    order: [&'static str; 3],
    broken: bool,
) -> Result<Report, Box<Failure>> {
    let pool: Arc<OnceLock<MySqlPool>> = Arc::default();
    let kit = register(Kit::new().cases(64), order, |kind| {
        count_effect(Arc::clone(&pool), table.to_owned(), kind)
    });
    let (url, table) = (url.to_owned(), table.to_owned());
    kit.run_with(|setup| async move {
        let store = setup.mysql(&url, MySqlConfig::default()).await?;
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS {table} (kind VARCHAR(16) NOT NULL, order_id VARCHAR(255) NOT NULL) ENGINE = InnoDB"
        )))
        .execute(store.pool())
        .await?;
        let _ = pool.set(store.pool().clone());
        let side = store.pool().clone();
        Ok(Subject {
            store: Arc::new(store.clone()) as Arc<dyn DedupStore>,
            consumer: mysql_tx(TxInbox::new(store), move |conn, _lease, message, _fx| {
                let (side, table) = (side.clone(), table.clone());
                Box::pin(async move {
                    let insert = format!("INSERT INTO {table} VALUES (?, ?)");
                    let audit = sqlx::query(AssertSqlSafe(insert.clone()))
                        .bind(BROKEN)
                        .bind(message.id());
                    if broken {
                        audit.execute(&side).await?;
                    } else {
                        audit.execute(&mut *conn).await?;
                    }
                    for kind in ["invoice", "event"] {
                        sqlx::query(AssertSqlSafe(insert.clone()))
                            .bind(kind)
                            .bind(message.id())
                            .execute(&mut *conn)
                            .await?;
                    }
                    Ok(Some(b"done".to_vec()))
                })
            }),
        })
    })
}

/// A current-thread runtime and a pool for a test's own reads.
fn admin(url: &str) -> (tokio::runtime::Runtime, MySqlPool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let pool = rt.block_on(MySqlPool::connect(url)).expect("a pool");
    (rt, pool)
}

#[test]
fn every_effect_is_checked_whatever_the_registration_order_on_mysql() {
    let Some(url) = dedup_conformance::server_url("DEDUP_MYSQL_URL") else {
        eprintln!("SKIPPED: DEDUP_MYSQL_URL is not set");
        return;
    };
    let table = format!("dedup_testkit_fx_{}", std::process::id());
    let right = three_effects(&url, &table, ORDERS[0], false);
    let broken = ORDERS.map(|order| (order, three_effects(&url, &table, order, true)));
    // The effects table goes before any assertion can fail.
    let (rt, pool) = admin(&url);
    rt.block_on(sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}"))).execute(&pool))
        .expect("dropping the effects table");
    let report = right.unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(report.runs, 64, "{report:?}");
    for (order, ran) in broken {
        let f = ran.expect_err("the audit row written outside the transaction must be caught");
        audit_repeated(&f, order);
    }
}

/// How many tables of the database, rows of the versions table and rows of the purge
/// runs table are named with a prefix.
type Named = (i64, i64, i64);

/// The [`Named`] counts for `prefix`.
async fn named_with(pool: &MySqlPool, prefix: &str) -> Named {
    let tables: i64 = sqlx::query_scalar(
        "SELECT CAST(count(*) AS SIGNED) FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND LOCATE(?, table_name) = 1",
    )
    .bind(prefix)
    .fetch_one(pool)
    .await
    .expect("the tables");
    let mut rows = [0i64; 2];
    for (n, shared) in rows
        .iter_mut()
        .zip([SCHEMA_VERSIONS_TABLE, PURGE_RUNS_TABLE])
    {
        *n = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT CAST(count(*) AS SIGNED) FROM {shared} WHERE LOCATE(?, table_name) = 1"
        )))
        .bind(prefix)
        .fetch_one(pool)
        .await
        .expect("the shared rows");
    }
    (tables, rows[0], rows[1])
}

#[test]
fn a_run_leaves_no_table_of_its_own_on_mysql() {
    let Some(url) = dedup_conformance::server_url("DEDUP_MYSQL_URL") else {
        eprintln!("SKIPPED: DEDUP_MYSQL_URL is not set");
        return;
    };
    // The run's tables as the setup saw them: their prefix, and what was there.
    let seen: Arc<OnceLock<(String, Named)>> = Arc::default();
    let during = Arc::clone(&seen);
    let report = Kit::new()
        .cases(16)
        .run_with(|setup| async move {
            let store = setup.mysql(&url, MySqlConfig::default()).await?;
            let prefix = setup.inbox_table().to_owned();
            let found = named_with(store.pool(), &prefix).await;
            let _ = during.set((prefix, found));
            let outbox = store.outbox();
            Ok(Subject {
                store: Arc::new(store.clone()) as Arc<dyn DedupStore>,
                // Each message also puts an event with an ordering key in the outbox.
                consumer: mysql_tx(TxInbox::new(store), move |conn, _lease, message, _fx| {
                    let outbox = outbox.clone();
                    Box::pin(async move {
                        let event = OutboxMessage::new("events", message.id(), b"{}".to_vec())?
                            .ordering_key("orders")?;
                        outbox.enqueue(&mut *conn, &[event]).await?;
                        Ok(None)
                    })
                }),
            })
        })
        .unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(report.runs, 16, "{report:?}");
    let (prefix, during) = seen.get().cloned().expect("the setup ran");
    // The records, the outbox and its keys table, with versions rows for the first two.
    assert_eq!(during.0, 3, "{prefix}: {during:?}");
    assert_eq!(during.1, 2, "{prefix}: {during:?}");
    let (rt, pool) = admin(&dedup_conformance::server_url("DEDUP_MYSQL_URL").expect("set"));
    let after = rt.block_on(named_with(&pool, &prefix));
    assert_eq!(
        after,
        (0, 0, 0),
        "{prefix}: tables, versions rows, purge runs rows left"
    );
}

/// The inbox as a service builds it behind a broker consumer: each run's transaction
/// begun by the service's own closure (`with_begin`; here it sets the isolation level), so
/// the billing runs check that production path: begun, committed, rolled back and
/// retried on conflicts by the inbox.
fn own_tx(store: dedup_mysql::MySqlStore) -> TxInbox {
    let pool = store.pool().clone();
    TxInbox::new(store).with_begin(move || {
        let pool = pool.clone();
        async move {
            pool.begin_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
                .await
        }
    })
}
