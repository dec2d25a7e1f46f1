//! MySQL / MariaDB: the store on a table of its own, and the raw baseline on a plain table
//! of the same shape through an sqlx pool built with the store's pool options. The
//! transactional mode runs on that pool too, with a business table beside.
//!
//! A node of a MariaDB Galera cluster is benched the same way, as an application uses one:
//! every connection to the node of the URL, each write replicated to the other nodes and
//! certified before its commit returns. The rows are named `galera`.

use std::sync::Arc;

use dedup_core::{Clock, ManualClock};
use dedup_mysql::sqlx::{self, AssertSqlSafe, MySqlConnection, MySqlPool};
use dedup_mysql::{MySqlConfig, MySqlStore, SqlSettings, TxInbox};
use futures::FutureExt;
use futures::future::BoxFuture;

use super::sql::{SqlRaw, SqlTx, Statement, Statements, expect_rows};
use super::target::Target;
use super::{Bench, NOT_SHARED, Names, Params, Result, now_ms, token};

/// Columns and primary key of the store's table (see dedup-mysql's migration), without
/// its check constraint and purge index.
const RAW_TABLE: &str = "CREATE TABLE {table} (
    consumer     VARBINARY(200) NOT NULL,
    message_id   VARBINARY(255) NOT NULL,
    token        CHAR(36) CHARACTER SET ascii,
    fence        BIGINT NOT NULL,
    attempt      BIGINT NOT NULL,
    claimed_at   BIGINT NOT NULL,
    expires_at   BIGINT,
    processed_at BIGINT,
    outcome      MEDIUMBLOB,
    fingerprint  VARBINARY(512),
    PRIMARY KEY (consumer, message_id)
) ENGINE = InnoDB";

/// The store's purge index, for `--raw-indexes`.
const RAW_INDEXES: &str = "CREATE INDEX claimed_idx ON {table} (claimed_at)";

/// The lease of the raw claims, in milliseconds.
const RAW_LEASE_MS: i64 = 30_000;

/// The raw claim of one key (consumer, message id, token, claimed_at, expires_at): an
/// insert that does nothing when the key exists. `INSERT IGNORE`, whose affected-row count
/// tells an insert (1) from a duplicate (0); `ON DUPLICATE KEY UPDATE` of nothing reports 1
/// for both through sqlx (`CLIENT_FOUND_ROWS`).
const INSERT: &str = "INSERT IGNORE INTO {table} (consumer, message_id, token, fence, attempt, claimed_at, expires_at) \
     VALUES (?, ?, ?, 1, 1, ?, ?)";

/// The raw commit of one key (now, consumer, message id).
const UPDATE: &str = "UPDATE {table} SET processed_at = ?, expires_at = NULL \
     WHERE consumer = ? AND message_id = ?";

/// The application's own table the transactional measures insert into.
const BUSINESS_TABLE: &str = "CREATE TABLE {table} (
    id         BIGINT AUTO_INCREMENT PRIMARY KEY,
    consumer   VARBINARY(200) NOT NULL,
    message_id VARBINARY(255) NOT NULL,
    amount     BIGINT NOT NULL
) ENGINE = InnoDB";

/// The business insert (consumer, message id, amount).
const INSERT_BUSINESS: &str = "INSERT INTO {table} (consumer, message_id, amount) VALUES (?, ?, ?)";

/// The two-transaction inbox: lock the key's row of the raw table; whether it is
/// consumed (no row: none).
const LOCK_ROW: &str = "SELECT CAST(processed_at IS NOT NULL AS SIGNED) FROM {table} \
     WHERE consumer = ? AND message_id = ? FOR UPDATE";

const DROP: &str = "DROP TABLE IF EXISTS {table}";
/// The MySQL / MariaDB bench, chosen by the store URL's descriptor.
pub(crate) static BENCH: Bench = Bench {
    descriptor: &dedup_mysql::DESCRIPTOR,
    settings: false,
    open: |target, _, names, params| {
        async move {
            let target = target
                .downcast::<dedup_mysql::MySqlTarget>()
                .map_err(|_| NOT_SHARED)?;
            open(&target.url, names, params).await
        }
        .boxed()
    },
    temporary: None,
};

/// Connect the store, the purge store and the baseline to `url`.
pub(crate) async fn open(url: &str, names: &Names, params: &Params) -> Result<Target> {
    let config = MySqlConfig::from(SqlSettings {
        table: names.table.clone(),
        ..Default::default()
    });
    let store = MySqlStore::connect_with(url, config.clone()).await?;
    let clock = Arc::new(ManualClock::starting_now());
    let purge_store = MySqlStore::connect_with(
        url,
        MySqlConfig::from(SqlSettings {
            table: names.purge_table.clone(),
            clock: Some(Arc::clone(&clock) as Arc<dyn Clock>),
            ..config.sql.clone()
        }),
    )
    .await?;
    // The store's own pool options: the baseline then differs by its statements only.
    let pool = dedup_mysql::pool_options(&config).connect(url).await?;
    let quoted = |table: &str| format!("`{table}`");
    let raw_table = quoted(&names.raw_table);
    let business_table = quoted(&names.business_table);
    let render = |sql: &str| sql.replace("{table}", &raw_table);
    let render_business = |sql: &str| sql.replace("{table}", &business_table);
    sqlx::raw_sql(AssertSqlSafe(render(RAW_TABLE)))
        .execute(&pool)
        .await?;
    sqlx::raw_sql(AssertSqlSafe(render_business(BUSINESS_TABLE)))
        .execute(&pool)
        .await?;
    if params.raw_indexes {
        sqlx::raw_sql(AssertSqlSafe(render(RAW_INDEXES)))
            .execute(&pool)
            .await?;
    }
    // The server's commit durability is part of the figure (1: every commit flushed, as
    // production runs; 2, the test services' setting: written at commit, flushed once a
    // second), and so is its buffer pool: a table larger than the pool is read from disk
    // page by page (a purge deletes in `claimed_at` order, so its rows lie on pages all
    // over the primary key's random UUID order).
    let (version, flush, buffer_pool): (String, i64, i64) = sqlx::query_as(
        "SELECT VERSION(), CAST(@@innodb_flush_log_at_trx_commit AS SIGNED), \
         CAST(@@innodb_buffer_pool_size AS SIGNED)",
    )
    .fetch_one(&pool)
    .await?;
    let galera = galera_nodes(&pool).await?;
    let raw = Arc::new(MySqlStatements {
        table: raw_table.clone(),
        insert: render(INSERT),
        update: render(UPDATE),
        insert_business: render_business(INSERT_BUSINESS),
        lock_row: render(LOCK_ROW),
        drops: [
            &names.table,
            &names.raw_table,
            &names.purge_table,
            &names.business_table,
        ]
        .iter()
        .map(|t| DROP.replace("{table}", &quoted(t)))
        .collect(),
        pool,
    });
    let tx = SqlTx {
        raw: Arc::clone(&raw),
        store: store.clone(),
        inbox: TxInbox::new(store.clone()),
        inbox_as_hand: TxInbox::new(store.clone()),
    };
    Ok(Target {
        backend: if galera.is_some() { "galera" } else { "mysql" },
        store: Arc::new(store),
        purge_store: Arc::new(purge_store),
        clock,
        raw: Arc::new(SqlRaw(raw)),
        tx: Some(Arc::new(tx)),
        setup: format!(
            "{version}{}, innodb_flush_log_at_trx_commit={flush}, innodb_buffer_pool_size={} MiB; \
             pool {} (store and raw, the store's pool options){}",
            galera
                .map(|nodes| format!(
                    ", Galera cluster of {} nodes ({nodes}), every connection to the URL's node",
                    nodes.split(',').count()
                ))
                .unwrap_or_default(),
            buffer_pool >> 20,
            config.max_connections,
            if params.raw_indexes {
                ", raw with the store's index"
            } else {
                ""
            }
        ),
    })
}

/// The SQL addresses of the Galera cluster's nodes (`wsrep_incoming_addresses`,
/// comma-separated) when the server is a node of one; `None` for a plain server.
pub(crate) async fn galera_nodes<'c, E>(conn: E) -> Result<Option<String>>
where
    E: sqlx::Executor<'c, Database = sqlx::MySql>,
{
    let found: Option<(String, String)> =
        sqlx::query_as("SHOW GLOBAL STATUS LIKE 'wsrep_incoming_addresses'")
            .fetch_optional(conn)
            .await?;
    Ok(found
        .map(|(_, nodes)| nodes)
        .filter(|nodes| nodes.contains(':')))
}

/// MySQL's raw statements, rendered for the bench's tables, and their pool.
struct MySqlStatements {
    pool: MySqlPool,
    table: String,
    insert: String,
    update: String,
    insert_business: String,
    lock_row: String,
    drops: Vec<String>,
}

impl Statements for MySqlStatements {
    type Store = MySqlStore;

    const INSERT_BEFORE_LOCK: bool = true;

    fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    fn execute<'a>(
        &'a self,
        conn: &'a mut MySqlConnection,
        statement: Statement,
        consumer: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<u64>> {
        async move {
            let now = now_ms();
            let query = match statement {
                Statement::Claim => sqlx::query(AssertSqlSafe(self.insert.clone()))
                    .bind(consumer)
                    .bind(id)
                    .bind(token())
                    .bind(now)
                    .bind(now + RAW_LEASE_MS),
                Statement::Commit => sqlx::query(AssertSqlSafe(self.update.clone()))
                    .bind(now)
                    .bind(consumer)
                    .bind(id),
                Statement::Business => sqlx::query(AssertSqlSafe(self.insert_business.clone()))
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
        conn: &'a mut MySqlConnection,
        consumer: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<bool>>> {
        async move {
            let consumed: Option<(i64,)> = sqlx::query_as(AssertSqlSafe(self.lock_row.clone()))
                .bind(consumer)
                .bind(id)
                .fetch_optional(conn)
                .await?;
            Ok(consumed.map(|(c,)| c != 0))
        }
        .boxed()
    }

    fn batch<'a>(&'a self, consumer: &'a str, ids: &'a [String]) -> BoxFuture<'a, Result<()>> {
        async move {
            let now = now_ms();
            let rows = vec!["(?, ?, ?, 1, 1, ?, ?)"; ids.len()].join(", ");
            let insert = format!(
                "INSERT IGNORE INTO {} (consumer, message_id, token, fence, attempt, claimed_at, expires_at) \
                 VALUES {rows}",
                self.table
            );
            let mut query = sqlx::query(AssertSqlSafe(insert));
            for id in ids {
                query = query
                    .bind(consumer)
                    .bind(id)
                    .bind(token())
                    .bind(now)
                    .bind(now + RAW_LEASE_MS);
            }
            let inserted = query.execute(&self.pool).await?;
            expect_rows("INSERT", inserted.rows_affected(), ids.len())?;
            let list = vec!["?"; ids.len()].join(", ");
            let update = format!(
                "UPDATE {} SET processed_at = ?, expires_at = NULL \
                 WHERE consumer = ? AND message_id IN ({list})",
                self.table
            );
            let mut query = sqlx::query(AssertSqlSafe(update)).bind(now_ms()).bind(consumer);
            for id in ids {
                query = query.bind(id);
            }
            let updated = query.execute(&self.pool).await?;
            expect_rows("UPDATE", updated.rows_affected(), ids.len())
        }
        .boxed()
    }

    fn cleanup(&self) -> BoxFuture<'_, Result<()>> {
        async move {
            for drop in &self.drops {
                sqlx::raw_sql(AssertSqlSafe(drop.clone()))
                    .execute(&self.pool)
                    .await?;
            }
            Ok(())
        }
        .boxed()
    }
}
