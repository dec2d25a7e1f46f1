//! PostgreSQL: the store on a table of its own, and the raw baseline on a plain table of
//! the same shape through an sqlx pool of the store's size.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::{Clock, ManualClock};
use dedup_postgres::sqlx::postgres::PgPoolOptions;
use dedup_postgres::sqlx::{self, AssertSqlSafe, PgPool, SqlSafeStr, SqlStr};
use dedup_postgres::{PostgresConfig, PostgresStore};
use futures::FutureExt;
use futures::future::BoxFuture;

use super::target::{Raw, Target};
use super::{Names, Params, Result, now_ms, token};

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

/// The store's purge indexes, for `--raw-indexes`.
const RAW_INDEXES: &str = "CREATE INDEX ON {table} (processed_at) WHERE processed_at IS NOT NULL;
    CREATE INDEX ON {table} (expires_at) WHERE processed_at IS NULL;";

/// The raw claim of one key ($1 consumer, $2 message id, $3 token, $4 expires_at).
const INSERT: &str = "INSERT INTO {table} (consumer, message_id, token, fence, attempt, expires_at) \
     VALUES ($1, $2, $3::uuid, 1, 1, $4) ON CONFLICT DO NOTHING";

/// The raw commit of one key ($1 consumer, $2 message id, $3 now).
const UPDATE: &str = "UPDATE {table} SET processed_at = $3, expires_at = NULL \
     WHERE consumer = $1 AND message_id = $2";

/// The raw claim of a batch ($1 consumer, $2 message ids, $3 tokens, $4 expires_at).
const INSERT_MANY: &str = "INSERT INTO {table} (consumer, message_id, token, fence, attempt, expires_at) \
     SELECT $1, u.message_id, u.token::uuid, 1, 1, $4 \
     FROM unnest($2::text[], $3::text[]) AS u(message_id, token) \
     ON CONFLICT DO NOTHING";

/// The raw commit of a batch ($1 consumer, $2 message ids, $3 now): index-driven (a join
/// against `unnest` can scan all of a fresh consumer's rows per batch while the planner's
/// statistics lag behind).
const UPDATE_MANY: &str = "UPDATE {table} SET processed_at = $3, expires_at = NULL \
     WHERE consumer = $1 AND message_id = ANY($2)";

const DROP: &str = "DROP TABLE IF EXISTS {table}";

/// Connect the store, the purge store and the baseline to `url`.
pub(crate) async fn open(url: &str, names: &Names, params: &Params) -> Result<Target> {
    let config = PostgresConfig {
        table: names.table.clone(),
        ..PostgresConfig::default()
    };
    let store = PostgresStore::connect_with(url, config.clone()).await?;
    let clock = Arc::new(ManualClock::starting_now());
    let purge_store = PostgresStore::connect_with(
        url,
        PostgresConfig {
            table: names.purge_table.clone(),
            clock: Some(Arc::clone(&clock) as Arc<dyn Clock>),
            ..config.clone()
        },
    )
    .await?;
    let pool = PgPoolOptions::new()
        .max_connections(config.max_connections)
        .connect(url)
        .await?;
    let qualified = |table: &str| format!("\"{}\".\"{table}\"", config.schema);
    let raw_table = qualified(&names.raw_table);
    let render =
        |sql: &str| SqlSafeStr::into_sql_str(AssertSqlSafe(sql.replace("{table}", &raw_table)));
    sqlx::raw_sql(render(RAW_TABLE)).execute(&pool).await?;
    if params.raw_indexes {
        sqlx::raw_sql(render(RAW_INDEXES)).execute(&pool).await?;
    }
    let raw = PostgresRaw {
        inner: Arc::new(Inner {
            insert: render(INSERT),
            update: render(UPDATE),
            insert_many: render(INSERT_MANY),
            update_many: render(UPDATE_MANY),
            drops: [&names.table, &names.raw_table, &names.purge_table]
                .iter()
                .map(|t| {
                    SqlSafeStr::into_sql_str(AssertSqlSafe(DROP.replace("{table}", &qualified(t))))
                })
                .collect(),
            pool,
        }),
    };
    Ok(Target {
        backend: "postgres",
        store: Arc::new(store),
        purge_store: Arc::new(purge_store),
        clock,
        raw: Arc::new(raw),
        setup: format!(
            "pool {} (store and raw){}",
            config.max_connections,
            if params.raw_indexes {
                ", raw with the store's indexes"
            } else {
                ""
            }
        ),
    })
}

/// The raw baseline.
struct PostgresRaw {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    insert: SqlStr,
    update: SqlStr,
    insert_many: SqlStr,
    update_many: SqlStr,
    drops: Vec<SqlStr>,
}

fn expect_rows(what: &str, changed: u64, wanted: usize) -> Result<()> {
    if changed == wanted as u64 {
        Ok(())
    } else {
        Err(format!("raw {what} changed {changed} rows, expected {wanted}").into())
    }
}

fn expires_at(now: i64) -> i64 {
    now + Duration::from_secs(30).as_millis() as i64
}

impl Raw for PostgresRaw {
    fn claim_commit(
        &self,
        _worker: usize,
        consumer: Arc<str>,
        message_id: String,
    ) -> BoxFuture<'static, Result<()>> {
        let inner = Arc::clone(&self.inner);
        async move {
            let inserted = sqlx::query(inner.insert.clone())
                .bind(&*consumer)
                .bind(&message_id)
                .bind(token())
                .bind(expires_at(now_ms()))
                .execute(&inner.pool)
                .await?;
            expect_rows("INSERT", inserted.rows_affected(), 1)?;
            let updated = sqlx::query(inner.update.clone())
                .bind(&*consumer)
                .bind(&message_id)
                .bind(now_ms())
                .execute(&inner.pool)
                .await?;
            expect_rows("UPDATE", updated.rows_affected(), 1)
        }
        .boxed()
    }

    fn batch(
        &self,
        _worker: usize,
        consumer: Arc<str>,
        message_ids: Vec<String>,
    ) -> BoxFuture<'static, Result<()>> {
        let inner = Arc::clone(&self.inner);
        async move {
            let tokens: Vec<String> = message_ids.iter().map(|_| token()).collect();
            let inserted = sqlx::query(inner.insert_many.clone())
                .bind(&*consumer)
                .bind(&message_ids)
                .bind(&tokens)
                .bind(expires_at(now_ms()))
                .execute(&inner.pool)
                .await?;
            expect_rows("INSERT", inserted.rows_affected(), message_ids.len())?;
            let updated = sqlx::query(inner.update_many.clone())
                .bind(&*consumer)
                .bind(&message_ids)
                .bind(now_ms())
                .execute(&inner.pool)
                .await?;
            expect_rows("UPDATE", updated.rows_affected(), message_ids.len())
        }
        .boxed()
    }

    fn cleanup(&self) -> BoxFuture<'static, Result<()>> {
        let inner = Arc::clone(&self.inner);
        async move {
            for drop in &inner.drops {
                sqlx::raw_sql(drop.clone()).execute(&inner.pool).await?;
            }
            Ok(())
        }
        .boxed()
    }
}
