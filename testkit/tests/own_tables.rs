//! A kit run against a service's own database leaves the service alone: the kit's store
//! lives on tables of its own (fresh per run, dropped after it, also when the run fails),
//! so the service's tables (its orders, its inbox, its outbox, the schema versions) are
//! byte-for-byte what they were, and no table of the kit's is left. PostgreSQL (needs
//! `DEDUP_POSTGRES_URL`; skips without it, fails under `DEDUP_TEST_STRICT=1`) and SQLite.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use dedup_core::outbox::OutboxMessage;
use dedup_core::{BoxError, ClaimOptions, DedupStore, Key};
use dedup_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use dedup_postgres::{PostgresConfig, PostgresStore, SqlSettings};
use dedup_sqlite::rusqlite::{Connection, types::Value};
use dedup_sqlite::{SqliteConfig, SqliteStore};
use dedup_testkit::{Kit, Subject, lease, postgres_tx, sqlite_tx};

/// The service's state: three records (two processed, one in flight) and two outbox
/// messages, in its own inbox and outbox, beside its `orders` table.
async fn seed(store: &dyn DedupStore) -> Result<(), BoxError> {
    for (id, done) in [("o-1", true), ("o-2", true), ("o-3", false)] {
        let key = Key::new("billing", id)?;
        let lease = store
            .claim(&key, &ClaimOptions::default())
            .await?
            .into_lease()
            .ok_or("a fresh key is acquired")?;
        if done {
            store.commit(&lease, Some(b"invoiced")).await?;
        }
    }
    Ok(())
}

fn outbox_messages() -> Vec<OutboxMessage> {
    ["o-1", "o-2"]
        .iter()
        .map(|id| OutboxMessage::new("invoices", format!("invoice-{id}"), b"{}".to_vec()))
        .collect::<Result<_, _>>()
        .expect("valid messages")
}

// PostgreSQL.

/// Every table of `schema` with its rows as text, sorted: equal snapshots mean the same
/// tables with byte-for-byte the same rows.
async fn pg_snapshot(pool: &PgPool, schema: &str) -> BTreeMap<String, Vec<String>> {
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = $1")
            .bind(schema)
            .fetch_all(pool)
            .await
            .expect("the schema's tables");
    let mut out = BTreeMap::new();
    for table in tables {
        let rows: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT t::text FROM \"{schema}\".\"{table}\" t ORDER BY 1"
        )))
        .fetch_all(pool)
        .await
        .expect("a table's rows");
        out.insert(table, rows);
    }
    out
}

/// A schema holding a service: `orders`, its inbox and outbox with rows.
async fn pg_service(url: &str, schema: &str) -> PgPool {
    let store = PostgresStore::connect_with(
        url,
        PostgresConfig {
            schema: schema.into(),
            sql: SqlSettings {
                table: "billing_inbox".into(),
                ..Default::default()
            },
            ..PostgresConfig::default()
        },
    )
    .await
    .expect("the service's store");
    let pool = store.pool().clone();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE \"{schema}\".orders (id text PRIMARY KEY, cents bigint NOT NULL);
         INSERT INTO \"{schema}\".orders VALUES ('o-1', 4999), ('o-2', 1250), ('o-3', 99)"
    )))
    .execute(&pool)
    .await
    .expect("the orders");
    seed(&store).await.expect("the service's records");
    let mut conn = pool.acquire().await.expect("a connection");
    store
        .outbox()
        .enqueue(&mut conn, &outbox_messages())
        .await
        .expect("the service's outbox rows");
    pool
}

fn pg_schema(test: &str) -> String {
    format!("dedup_tk_{test}_{}", std::process::id())
}

async fn pg_fresh_schema(pool: &PgPool, schema: &str) {
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE; CREATE SCHEMA \"{schema}\""
    )))
    .execute(pool)
    .await
    .expect("a fresh schema");
}

/// A current-thread runtime for a test's own async steps (the kit runs its own).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A fresh schema of the test's own on the test server, and an admin pool (on `rt`) to
/// read and drop it; `None` (the test skips) without `DEDUP_POSTGRES_URL`.
struct PgScratch {
    url: String,
    schema: String,
    rt: tokio::runtime::Runtime,
    admin: PgPool,
}

impl PgScratch {
    fn new(test: &str) -> Option<Self> {
        let Some(url) = dedup_conformance::server_url("DEDUP_POSTGRES_URL") else {
            eprintln!("SKIPPED: DEDUP_POSTGRES_URL is not set");
            return None;
        };
        let schema = pg_schema(test);
        let rt = runtime();
        let admin = rt.block_on(async {
            let admin = PgPool::connect(&url).await.expect("a pool");
            pg_fresh_schema(&admin, &schema).await;
            admin
        });
        Some(PgScratch {
            url,
            schema,
            rt,
            admin,
        })
    }

    /// Every table of the schema and its rows.
    fn snapshot(&self) -> BTreeMap<String, Vec<String>> {
        self.rt.block_on(pg_snapshot(&self.admin, &self.schema))
    }

    /// Drop the schema and all in it.
    fn drop_schema(self) {
        let sql = format!("DROP SCHEMA \"{}\" CASCADE", self.schema);
        self.rt.block_on(async {
            sqlx::query(AssertSqlSafe(sql))
                .execute(&self.admin)
                .await
                .expect("dropping the test schema");
        });
    }
}

/// The kit's PostgreSQL store for `setup`, in `schema`.
async fn pg_kit_store(
    setup: &dedup_testkit::Setup,
    url: &str,
    schema: String,
) -> Result<PostgresStore, BoxError> {
    Ok(setup
        .postgres(
            url,
            PostgresConfig {
                schema,
                ..PostgresConfig::default()
            },
        )
        .await?)
}

/// The billing consumer in transactional mode on the kit's store in `schema`: the invoice
/// event goes to the store's outbox in the handler's transaction, and the kit counts it
/// there (so the run provably wrote outbox rows, in its own outbox table).
fn pg_kit_run(url: String, schema: String, cases: u32) {
    let found: Arc<OnceLock<(PgPool, String)>> = Arc::default();
    let query = Arc::clone(&found);
    let schema_q = schema.clone();
    Kit::new()
        .cases(cases)
        .expect_effect("charge")
        .effects_query("invoice event", move |ids: Vec<String>| {
            let (found, schema) = (query.get().cloned(), schema_q.clone());
            async move {
                let (pool, outbox) = found.ok_or("no store yet")?;
                let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
                    "SELECT message_id, count(*) FROM \"{schema}\".\"{outbox}\" WHERE message_id = ANY($1) GROUP BY message_id"
                )))
                .bind(&ids)
                .fetch_all(&pool)
                .await?;
                Ok::<_, BoxError>(rows.into_iter().map(|(id, n)| (id, n as usize)).collect())
            }
        })
        .expect("each effect has its own name")
        .check_with(|setup| async move {
            assert!(setup.owns_tables());
            assert!(setup.inbox_table().starts_with("dedup_testkit_"));
            let store = pg_kit_store(&setup, &url, schema.clone()).await?;
            let _ = found.set((store.pool().clone(), setup.outbox_table().to_owned()));
            let outbox = store.outbox();
            Ok(Subject {
                store: Arc::new(store.clone()) as Arc<dyn DedupStore>,
                consumer: postgres_tx(
                    dedup_postgres::TxInbox::new(store),
                    move |conn, lease, message, fx| {
                        let outbox = outbox.clone();
                        Box::pin(async move {
                            let event = OutboxMessage::new("invoices", message.id(), b"{}".to_vec())?;
                            outbox.enqueue(conn, &[event]).await?;
                            fx.call_with_key("charge", &lease.idempotency_key()).await?;
                            Ok(None)
                        })
                    },
                ),
            })
        });
}

#[test]
fn a_run_leaves_a_postgres_service_untouched() {
    let Some(pg) = PgScratch::new("pass") else {
        return;
    };
    pg.rt.block_on(pg_service(&pg.url, &pg.schema));
    let before = pg.snapshot();
    assert_eq!(
        before.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "billing_inbox",
            "billing_inbox_outbox",
            "dedup_purge_runs",
            "dedup_schema_versions",
            "orders"
        ],
    );
    assert_eq!(before["billing_inbox"].len(), 3, "{before:?}");
    assert_eq!(before["billing_inbox_outbox"].len(), 2, "{before:?}");

    pg_kit_run(pg.url.clone(), pg.schema.clone(), 64);

    let after = pg.snapshot();
    assert_eq!(after, before, "the kit changed the service's tables");
    pg.drop_schema();
}

#[test]
fn a_failing_run_drops_its_tables_on_postgres_too() {
    // A fresh schema without any dedup table: the kit creates the versions table too,
    // and drops it with its own.
    let Some(pg) = PgScratch::new("fail") else {
        return;
    };
    let created: Arc<OnceLock<String>> = Arc::default();
    let seen = Arc::clone(&created);
    let (u, s) = (pg.url.clone(), pg.schema.clone());
    let panicked = catch_unwind(AssertUnwindSafe(move || {
        Kit::new()
            .cases(4)
            .expect_effect("never made")
            .check_with(|setup| async move {
                let store = pg_kit_store(&setup, &u, s).await?;
                let _ = seen.set(setup.inbox_table().to_owned());
                Ok(Subject {
                    store: Arc::new(store) as Arc<dyn DedupStore>,
                    consumer: lease(|_, _, _| async { Ok(None) }),
                })
            })
    }));
    let story = panicked.expect_err("a missing effect fails the run");
    let story = story.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(story.contains("never made"), "{story}");
    let inbox = created.get().expect("the setup ran");
    let after = pg.snapshot();
    assert!(after.is_empty(), "left behind by {inbox}: {after:?}");
    pg.drop_schema();
}

// SQLite.

/// Every table of the file (its definition and its rows, sorted).
fn sqlite_snapshot(db: &Path) -> BTreeMap<String, (String, Vec<String>)> {
    let conn = Connection::open(db).expect("the database");
    let tables: Vec<(String, String)> = conn
        .prepare("SELECT name, sql FROM sqlite_master WHERE type = 'table'")
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()
        })
        .expect("the tables");
    tables
        .into_iter()
        .map(|(name, sql)| {
            let mut stmt = conn
                .prepare(&format!("SELECT * FROM \"{name}\""))
                .expect("a select");
            let n = stmt.column_count();
            let mut rows: Vec<String> = stmt
                .query_map([], |r| {
                    (0..n)
                        .map(|i| r.get::<_, Value>(i))
                        .collect::<Result<Vec<_>, _>>()
                        .map(|v| format!("{v:?}"))
                })
                .and_then(|rows| rows.collect())
                .expect("the rows");
            rows.sort();
            (name, (sql, rows))
        })
        .collect()
}

fn sqlite_service() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let db = dir.path().join("service.db");
    runtime().block_on(async {
        let store = SqliteStore::open_with(&db, SqliteConfig::with_table("billing_inbox"))
            .await
            .expect("the service's store");
        seed(&store).await.expect("the service's records");
        let conn = store.open_connection().expect("a connection");
        conn.execute_batch(
            "CREATE TABLE orders (id TEXT PRIMARY KEY, cents INTEGER NOT NULL);
             INSERT INTO orders VALUES ('o-1', 4999), ('o-2', 1250), ('o-3', 99);",
        )
        .expect("the orders");
        store
            .outbox()
            .enqueue(&conn, &outbox_messages())
            .expect("the service's outbox rows");
    });
    (dir, db)
}

#[test]
fn a_run_leaves_an_sqlite_service_untouched() {
    let (_dir, db) = sqlite_service();
    let before = sqlite_snapshot(&db);
    assert_eq!(
        before.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "billing_inbox",
            "billing_inbox_outbox",
            "dedup_purge_runs",
            "dedup_schema_versions",
            "orders",
            "sqlite_sequence"
        ],
    );
    assert_eq!(before["billing_inbox"].1.len(), 3, "{before:?}");
    assert_eq!(before["billing_inbox_outbox"].1.len(), 2, "{before:?}");

    let outbox_table: Arc<OnceLock<String>> = Arc::default();
    let (query_table, path, query_path) = (Arc::clone(&outbox_table), db.clone(), db.clone());
    Kit::new()
        .cases(64)
        .expect_effect("charge")
        .effects_query("invoice event", move |ids: Vec<String>| {
            let (table, db) = (query_table.get().cloned(), query_path.clone());
            futures::future::ready((|| {
                let table = table.ok_or("no store yet")?;
                let conn = Connection::open(&db)?;
                let mut counts = BTreeMap::new();
                for id in ids {
                    let n: i64 = conn.query_row(
                        &format!("SELECT count(*) FROM \"{table}\" WHERE message_id = ?1"),
                        [&id],
                        |r| r.get(0),
                    )?;
                    counts.insert(id, n as usize);
                }
                Ok::<_, BoxError>(counts)
            })())
        })
        .expect("each effect has its own name")
        .check_with(|setup| async move {
            let store = setup.sqlite(&path, SqliteConfig::default()).await?;
            let _ = outbox_table.set(setup.outbox_table().to_owned());
            let outbox = store.outbox();
            Ok(Subject {
                store: Arc::new(store.clone()) as Arc<dyn DedupStore>,
                consumer: sqlite_tx(
                    dedup_sqlite::TxInbox::new(store),
                    move |tx, lease, message, fx| {
                        let event = OutboxMessage::new("invoices", message.id(), b"{}".to_vec())?;
                        outbox.enqueue(tx, &[event])?;
                        fx.call_with_key_blocking("charge", &lease.idempotency_key())?;
                        Ok(None)
                    },
                ),
            })
        });

    assert_eq!(
        sqlite_snapshot(&db),
        before,
        "the kit changed the service's tables"
    );
}

#[test]
fn a_failing_run_drops_its_tables_on_sqlite_too() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let db = dir.path().join("empty.db");
    let path = db.clone();
    let panicked = catch_unwind(AssertUnwindSafe(move || {
        Kit::new()
            .cases(4)
            .expect_effect("never made")
            .check_with(|setup| async move {
                let store = setup.sqlite(&path, SqliteConfig::default()).await?;
                Ok(Subject {
                    store: Arc::new(store) as Arc<dyn DedupStore>,
                    consumer: lease(|_, _, _| async { Ok(None) }),
                })
            })
    }));
    assert!(panicked.is_err(), "a missing effect fails the run");
    // SQLite's own `sqlite_sequence` (made by the outbox's AUTOINCREMENT) stays, empty.
    let left = sqlite_snapshot(&db);
    assert_eq!(
        left.iter()
            .map(|(name, (_, rows))| (name.as_str(), rows.len()))
            .collect::<Vec<_>>(),
        [("sqlite_sequence", 0)],
        "{left:?}"
    );
}

#[test]
fn named_tables_are_an_explicit_opt_in_and_kept() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let db = dir.path().join("copy.db");
    let path = db.clone();
    let err = Kit::new()
        .named_tables("copy\"; DROP TABLE orders; --", "copy_outbox")
        .expect_err("an unsafe name");
    assert!(err.to_string().contains("inbox table"), "{err}");
    Kit::new()
        .named_tables("copy_inbox", "copy_inbox")
        .expect_err("one table for both");
    Kit::new()
        .cases(8)
        .named_tables("copy_inbox", "copy_outbox")
        .expect("safe names")
        .check_with(|setup| async move {
            assert!(!setup.owns_tables());
            let store = setup.sqlite(&path, SqliteConfig::default()).await?;
            Ok(Subject {
                store: Arc::new(store) as Arc<dyn DedupStore>,
                consumer: lease(|_, _, _| async { Ok(None) }),
            })
        });
    let tables = sqlite_snapshot(&db);
    assert!(tables.contains_key("copy_inbox"), "{tables:?}");
    assert!(tables.contains_key("copy_outbox"), "{tables:?}");
    assert!(!tables["copy_inbox"].1.is_empty(), "{tables:?}");
}

#[test]
fn a_panic_inside_the_run_still_drops_the_tables() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let db = dir.path().join("panics.db");
    let path = db.clone();
    let panicked = catch_unwind(AssertUnwindSafe(move || {
        Kit::new()
            .cases(4)
            // A failing effects query panics inside the kit's runtime, mid-run.
            .effects_query("broken", |_ids: Vec<String>| {
                futures::future::ready(Err::<BTreeMap<String, usize>, BoxError>(
                    "the query's table is missing".into(),
                ))
            })
            .expect("each effect has its own name")
            .check_with(|setup| async move {
                let store = setup.sqlite(&path, SqliteConfig::default()).await?;
                Ok(Subject {
                    store: Arc::new(store) as Arc<dyn DedupStore>,
                    consumer: lease(|_, _, _| async { Ok(None) }),
                })
            })
    }));
    let story = panicked.expect_err("the query's failure panics");
    let story = story.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        story.contains("the effects query \"broken\" failed"),
        "{story}"
    );
    let left = sqlite_snapshot(&db);
    assert_eq!(
        left.iter()
            .map(|(name, (_, rows))| (name.as_str(), rows.len()))
            .collect::<Vec<_>>(),
        [("sqlite_sequence", 0)],
        "{left:?}"
    );
}
