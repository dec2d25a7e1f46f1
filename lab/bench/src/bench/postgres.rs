//! PostgreSQL: the store on a table of its own, and the raw baseline on a plain table of
//! the same shape through an sqlx pool built with the store's pool options. The
//! transactional mode runs on that pool too, with a business table beside.
//!
//! The server's durability settings are part of the figure: the bench sets them first
//! ([`Durability`], `ALTER SYSTEM` and a reload), checks them with `SHOW` on a fresh
//! connection, names the rows after them and resets them when done.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_core::{Clock, ManualClock};
use dedup_postgres::sqlx::{self, AssertSqlSafe, PgConnection, PgPool, SqlSafeStr, SqlStr};
use dedup_postgres::{PostgresConfig, PostgresStore, SqlSettings, TxInbox};
use futures::FutureExt;
use futures::future::BoxFuture;

use super::sql::{SqlRaw, SqlTx, Statement, Statements, expect_rows};
use super::target::Target;
use super::{Bench, Durability, NOT_SHARED, Names, Params, Result, now_ms, token};

/// The settings that decide whether a commit waits for the disk, as `ALTER SYSTEM` sets
/// them for [`Durability::Durable`] and [`Durability::Fast`].
const DURABILITY_SETTINGS: [&str; 3] = ["fsync", "synchronous_commit", "full_page_writes"];

/// How long a reload may take to reach new connections.
const RELOAD_WAIT: Duration = Duration::from_secs(10);

/// The server's durability settings now, as `SHOW` gives them on a fresh connection.
async fn show_settings(url: &str) -> Result<Vec<(&'static str, String)>> {
    use dedup_postgres::sqlx::Connection;
    let mut conn = PgConnection::connect(url).await?;
    let mut out = Vec::new();
    for name in DURABILITY_SETTINGS {
        let (value,): (String,) = sqlx::query_as(SqlSafeStr::into_sql_str(AssertSqlSafe(format!(
            "SHOW {name}"
        ))))
        .fetch_one(&mut conn)
        .await?;
        out.push((name, value));
    }
    Ok(out)
}

/// Set the server to `durability` (nothing for [`Durability::Server`]) and wait until a
/// fresh connection sees it; the settings as `SHOW` then reports them, and whether they
/// are durable (a commit returns once its log record is on disk).
async fn apply_durability(url: &str, durability: Durability) -> Result<(String, bool)> {
    use dedup_postgres::sqlx::Connection;
    let wanted = match durability {
        Durability::Durable => Some("on"),
        Durability::Fast => Some("off"),
        Durability::Server => None,
    };
    if let Some(value) = wanted {
        let mut conn = PgConnection::connect(url).await?;
        // One statement per query: ALTER SYSTEM cannot run in a transaction block.
        for name in DURABILITY_SETTINGS {
            let sql = format!("ALTER SYSTEM SET {name} = {value}");
            sqlx::raw_sql(SqlSafeStr::into_sql_str(AssertSqlSafe(sql)))
                .execute(&mut conn)
                .await
                .map_err(|e| {
                    format!(
                        "setting {name} = {value} (ALTER SYSTEM needs a superuser; \
                         --postgres-durability server benches the server as it is): {e}"
                    )
                })?;
        }
        sqlx::raw_sql("SELECT pg_reload_conf()")
            .execute(&mut conn)
            .await?;
    }
    let started = Instant::now();
    loop {
        let settings = show_settings(url).await?;
        let on = |name: &str| settings.iter().any(|(n, v)| *n == name && v == "on");
        let applied = wanted.is_none_or(|w| settings.iter().all(|(_, v)| v == w));
        if applied {
            let shown = settings
                .iter()
                .map(|(n, v)| format!("{n}={v}"))
                .collect::<Vec<_>>()
                .join(" ");
            return Ok((shown, on("fsync") && on("synchronous_commit")));
        }
        if started.elapsed() > RELOAD_WAIT {
            return Err(format!(
                "the server did not take the {durability:?} settings within {RELOAD_WAIT:?}: {settings:?}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Undo [`apply_durability`]: back to the server's configuration files.
async fn reset_durability(pool: &PgPool) -> Result<()> {
    for name in DURABILITY_SETTINGS {
        let sql = format!("ALTER SYSTEM RESET {name}");
        sqlx::raw_sql(SqlSafeStr::into_sql_str(AssertSqlSafe(sql)))
            .execute(pool)
            .await?;
    }
    sqlx::raw_sql("SELECT pg_reload_conf()")
        .execute(pool)
        .await?;
    Ok(())
}

/// Columns and primary key of the store's table (see dedup-postgres's migration), without
/// its check constraint and purge indexes.
const RAW_TABLE: &str = "CREATE TABLE {table} (
    consumer     text    NOT NULL,
    message_id   text    NOT NULL,
    token        uuid,
    fence        bigint  NOT NULL,
    attempt      integer NOT NULL,
    expires_at   bigint,
    processed_at bigint,
    outcome      bytea,
    fingerprint  text,
    PRIMARY KEY (consumer, message_id)
)";

/// The store's purge column and index (schema version 2: `claimed_at`, set by claims), for
/// `--raw-indexes`; the raw claims then set it too, to the bound `expires_at` less the lease.
const RAW_INDEXES: &str = "ALTER TABLE {table} ADD COLUMN claimed_at bigint NOT NULL;
    CREATE INDEX ON {table} (claimed_at);";

/// The lease of the raw claims, in milliseconds.
const RAW_LEASE_MS: i64 = 30_000;

/// The raw claim of one key ($1 consumer, $2 message id, $3 token, $4 expires_at).
const INSERT: &str = "INSERT INTO {table} (consumer, message_id, token, fence, attempt, expires_at{claimed_col}) \
     VALUES ($1, $2, $3::uuid, 1, 1, $4{claimed_val}) ON CONFLICT DO NOTHING";

/// The raw commit of one key ($1 consumer, $2 message id, $3 now).
const UPDATE: &str = "UPDATE {table} SET processed_at = $3, expires_at = NULL \
     WHERE consumer = $1 AND message_id = $2";

/// The raw claim of a batch ($1 consumer, $2 message ids, $3 tokens, $4 expires_at).
const INSERT_MANY: &str = "INSERT INTO {table} (consumer, message_id, token, fence, attempt, expires_at{claimed_col}) \
     SELECT $1, u.message_id, u.token::uuid, 1, 1, $4{claimed_val} \
     FROM unnest($2::text[], $3::text[]) AS u(message_id, token) \
     ON CONFLICT DO NOTHING";

/// The raw commit of a batch ($1 consumer, $2 message ids, $3 now): index-driven (a join
/// against `unnest` can scan all of a fresh consumer's rows per batch while the planner's
/// statistics lag behind).
const UPDATE_MANY: &str = "UPDATE {table} SET processed_at = $3, expires_at = NULL \
     WHERE consumer = $1 AND message_id = ANY($2)";

/// The application's own table the transactional measures insert into.
const BUSINESS_TABLE: &str = "CREATE TABLE {table} (
    id         bigserial PRIMARY KEY,
    consumer   text   NOT NULL,
    message_id text   NOT NULL,
    amount     bigint NOT NULL
)";

/// The business insert ($1 consumer, $2 message id, $3 amount).
const INSERT_BUSINESS: &str =
    "INSERT INTO {table} (consumer, message_id, amount) VALUES ($1, $2, $3)";

/// The two-transaction inbox: lock the key's row of the raw table; whether it is
/// consumed ($1 consumer, $2 message id; no row: none).
const LOCK_ROW: &str = "SELECT processed_at IS NOT NULL FROM {table} \
     WHERE consumer = $1 AND message_id = $2 FOR UPDATE";

const DROP: &str = "DROP TABLE IF EXISTS {table}";
/// The PostgreSQL bench, chosen by the store URL's descriptor; it runs once per
/// `--postgres-durability` setting.
pub(crate) static BENCH: Bench = Bench {
    descriptor: &dedup_postgres::DESCRIPTOR,
    settings: true,
    open: |target, durability, names, params| {
        async move {
            let target = target
                .downcast::<dedup_postgres::PostgresTarget>()
                .map_err(|_| NOT_SHARED)?;
            open(&target.url, durability, names, params).await
        }
        .boxed()
    },
    temporary: None,
};

/// `COUNT,WINDOW` (`--postgres-partitions`) as the store's partitioned layout.
fn partitions(text: &str) -> Result<dedup_postgres::Partitions> {
    let (count, window) = text
        .split_once(',')
        .ok_or("--postgres-partitions takes COUNT,WINDOW (e.g. 6,30m)")?;
    let partitions = dedup_postgres::Partitions {
        count: count.trim().parse()?,
        window: dedup_core::parse_duration(window.trim())?,
    };
    partitions.validate()?;
    Ok(partitions)
}

/// Set the server to `durability`, then connect the store, the purge store and the
/// baseline to `url`.
pub(crate) async fn open(
    url: &str,
    durability: Durability,
    names: &Names,
    params: &Params,
) -> Result<Target> {
    let (settings, durable) = apply_durability(url, durability).await?;
    let mut config = PostgresConfig {
        sql: SqlSettings {
            table: names.table.clone(),
            ..Default::default()
        },
        ..PostgresConfig::default()
    };
    if let Some(ring) = &params.postgres_partitions {
        config.partitions = Some(partitions(ring)?);
    }
    match params.postgres_group_rounds {
        Some(0) => config.group_commit = None,
        Some(rounds) => {
            config.group_commit = Some(dedup_postgres::GroupCommit {
                rounds,
                ..Default::default()
            })
        }
        None => {}
    }
    let store = PostgresStore::connect_with(url, config.clone()).await?;
    let clock = Arc::new(ManualClock::starting_now());
    let purge_store = PostgresStore::connect_with(
        url,
        PostgresConfig {
            sql: SqlSettings {
                table: names.purge_table.clone(),
                clock: Some(Arc::clone(&clock) as Arc<dyn Clock>),
                ..config.sql.clone()
            },
            ..config.clone()
        },
    )
    .await?;
    // The store's own pool options (size, when to ping a connection before use): the
    // baseline then differs from the store by its statements only.
    let pool = dedup_postgres::pool_options(&config).connect(url).await?;
    let qualified = |table: &str| format!("\"{}\".\"{table}\"", config.schema);
    let raw_table = qualified(&names.raw_table);
    let business_table = qualified(&names.business_table);
    let (claimed_col, claimed_val) = if params.raw_indexes {
        (", claimed_at".to_owned(), format!(", $4 - {RAW_LEASE_MS}"))
    } else {
        (String::new(), String::new())
    };
    let render = |sql: &str| {
        SqlSafeStr::into_sql_str(AssertSqlSafe(
            sql.replace("{table}", &raw_table)
                .replace("{claimed_col}", &claimed_col)
                .replace("{claimed_val}", &claimed_val),
        ))
    };
    let render_business = |sql: &str| {
        SqlSafeStr::into_sql_str(AssertSqlSafe(sql.replace("{table}", &business_table)))
    };
    sqlx::raw_sql(render(RAW_TABLE)).execute(&pool).await?;
    sqlx::raw_sql(render_business(BUSINESS_TABLE))
        .execute(&pool)
        .await?;
    if params.raw_indexes {
        sqlx::raw_sql(render(RAW_INDEXES)).execute(&pool).await?;
    }
    let raw = Arc::new(PgStatements {
        insert: render(INSERT),
        update: render(UPDATE),
        insert_many: render(INSERT_MANY),
        update_many: render(UPDATE_MANY),
        insert_business: render_business(INSERT_BUSINESS),
        lock_row: render(LOCK_ROW),
        drops: [
            &names.table,
            &names.raw_table,
            &names.purge_table,
            &names.business_table,
        ]
        .iter()
        .map(|t| SqlSafeStr::into_sql_str(AssertSqlSafe(DROP.replace("{table}", &qualified(t)))))
        .collect(),
        pool,
        reset: durability != Durability::Server,
    });
    let tx = SqlTx {
        raw: Arc::clone(&raw),
        store: store.clone(),
        inbox: TxInbox::new(store.clone()),
        inbox_as_hand: TxInbox::new(store.clone()).with_durable_claims(),
    };
    Ok(Target {
        backend: if durable {
            "postgres"
        } else {
            "postgres-nosync"
        },
        store: Arc::new(store),
        purge_store: Arc::new(purge_store),
        clock,
        raw: Arc::new(SqlRaw(raw)),
        tx: Some(Arc::new(tx)),
        setup: format!(
            "{settings}; pool {} (store and raw, the store's pool options); group commit {}{}",
            config.max_connections,
            match config.group_commit {
                Some(g) => format!("{} rounds of at most {}", g.rounds, g.max_requests),
                None => "off".into(),
            },
            if params.raw_indexes {
                ", raw with the store's indexes"
            } else {
                ""
            }
        ),
    })
}

/// PostgreSQL's raw statements, rendered for the bench's tables, and their pool.
struct PgStatements {
    pool: PgPool,
    insert: SqlStr,
    update: SqlStr,
    insert_many: SqlStr,
    update_many: SqlStr,
    insert_business: SqlStr,
    lock_row: SqlStr,
    drops: Vec<SqlStr>,
    /// The bench set the server's durability settings: reset them at cleanup.
    reset: bool,
}

fn expires_at(now: i64) -> i64 {
    now + RAW_LEASE_MS
}

impl Statements for PgStatements {
    type Store = PostgresStore;

    const INSERT_BEFORE_LOCK: bool = false;

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn execute<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        statement: Statement,
        consumer: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<u64>> {
        async move {
            let query = match statement {
                Statement::Claim => sqlx::query(self.insert.clone())
                    .bind(consumer)
                    .bind(id)
                    .bind(token())
                    .bind(expires_at(now_ms())),
                Statement::Commit => sqlx::query(self.update.clone())
                    .bind(consumer)
                    .bind(id)
                    .bind(now_ms()),
                Statement::Business => sqlx::query(self.insert_business.clone())
                    .bind(consumer)
                    .bind(id)
                    .bind(100_i64),
            };
            Ok(query.execute(conn).await?.rows_affected())
        }
        .boxed()
    }

    fn lock_row<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        consumer: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<bool>>> {
        async move {
            let consumed: Option<(bool,)> = sqlx::query_as(self.lock_row.clone())
                .bind(consumer)
                .bind(id)
                .fetch_optional(conn)
                .await?;
            Ok(consumed.map(|(c,)| c))
        }
        .boxed()
    }

    fn batch<'a>(&'a self, consumer: &'a str, ids: &'a [String]) -> BoxFuture<'a, Result<()>> {
        async move {
            let tokens: Vec<String> = ids.iter().map(|_| token()).collect();
            let inserted = sqlx::query(self.insert_many.clone())
                .bind(consumer)
                .bind(ids)
                .bind(&tokens)
                .bind(expires_at(now_ms()))
                .execute(&self.pool)
                .await?;
            expect_rows("INSERT", inserted.rows_affected(), ids.len())?;
            let updated = sqlx::query(self.update_many.clone())
                .bind(consumer)
                .bind(ids)
                .bind(now_ms())
                .execute(&self.pool)
                .await?;
            expect_rows("UPDATE", updated.rows_affected(), ids.len())
        }
        .boxed()
    }

    fn cleanup(&self) -> BoxFuture<'_, Result<()>> {
        async move {
            for drop in &self.drops {
                sqlx::raw_sql(drop.clone()).execute(&self.pool).await?;
            }
            if self.reset {
                reset_durability(&self.pool).await?;
            }
            Ok(())
        }
        .boxed()
    }
}
