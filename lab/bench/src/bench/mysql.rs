//! MySQL / MariaDB: the store on a table of its own, and the raw baseline on a plain table
//! of the same shape through an sqlx pool built with the store's pool options. The
//! transactional mode runs on that pool too, with a business table beside.

use std::sync::Arc;

use dedup_core::{Clock, Key, ManualClock, TxClaim};
use dedup_mysql::sqlx::{self, AssertSqlSafe, MySqlConnection, MySqlPool};
use dedup_mysql::{MySqlConfig, MySqlStore, TxInbox};
use futures::FutureExt;
use futures::future::BoxFuture;

use super::target::{Raw, Target, Transactional, TxFlavor, hand_written, outbox_message};
use super::{Bench, BoxError, NOT_SHARED, Names, Params, Result, now_ms, token};

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
    let config = MySqlConfig {
        table: names.table.clone(),
        ..MySqlConfig::default()
    };
    let store = MySqlStore::connect_with(url, config.clone()).await?;
    let clock = Arc::new(ManualClock::starting_now());
    let purge_store = MySqlStore::connect_with(
        url,
        MySqlConfig {
            table: names.purge_table.clone(),
            clock: Some(Arc::clone(&clock) as Arc<dyn Clock>),
            ..config.clone()
        },
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
    let raw = MySqlRaw {
        inner: Arc::new(Inner {
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
        }),
    };
    let tx = MySqlTx {
        inner: Arc::clone(&raw.inner),
        store: store.clone(),
        inbox: TxInbox::new(store.clone()),
        inbox_as_hand: TxInbox::new(store.clone()),
    };
    Ok(Target {
        backend: "mysql",
        store: Arc::new(store),
        purge_store: Arc::new(purge_store),
        clock,
        raw: Arc::new(raw),
        tx: Some(Arc::new(tx)),
        setup: format!(
            "{version}, innodb_flush_log_at_trx_commit={flush}, innodb_buffer_pool_size={} MiB; \
             pool {} (store and raw, the store's pool options){}",
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

/// The raw baseline.
struct MySqlRaw {
    inner: Arc<Inner>,
}

struct Inner {
    pool: MySqlPool,
    table: String,
    insert: String,
    update: String,
    insert_business: String,
    lock_row: String,
    drops: Vec<String>,
}

impl Inner {
    /// The raw claim of one key on `conn`: `true` when it inserted.
    async fn try_insert(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        id: &str,
    ) -> Result<bool> {
        let now = now_ms();
        let inserted = sqlx::query(AssertSqlSafe(self.insert.clone()))
            .bind(consumer)
            .bind(id)
            .bind(token())
            .bind(now)
            .bind(now + RAW_LEASE_MS)
            .execute(&mut *conn)
            .await?;
        Ok(inserted.rows_affected() == 1)
    }

    /// The raw commit of one key on `conn`.
    async fn update(&self, conn: &mut MySqlConnection, consumer: &str, id: &str) -> Result<()> {
        sqlx::query(AssertSqlSafe(self.update.clone()))
            .bind(now_ms())
            .bind(consumer)
            .bind(id)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn insert_business(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        id: &str,
    ) -> Result<()> {
        let inserted = sqlx::query(AssertSqlSafe(self.insert_business.clone()))
            .bind(consumer)
            .bind(id)
            .bind(100_i64)
            .execute(conn)
            .await?;
        expect_rows("business INSERT", inserted.rows_affected(), 1)
    }

    /// Lock the key's raw row: whether it is consumed (`None`: no row).
    async fn lock_row(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        id: &str,
    ) -> Result<Option<bool>> {
        let consumed: Option<(i64,)> = sqlx::query_as(AssertSqlSafe(self.lock_row.clone()))
            .bind(consumer)
            .bind(id)
            .fetch_optional(conn)
            .await?;
        Ok(consumed.map(|(c,)| c != 0))
    }
}

fn expect_rows(what: &str, changed: u64, wanted: usize) -> Result<()> {
    if changed == wanted as u64 {
        Ok(())
    } else {
        Err(format!("raw {what} changed {changed} rows, expected {wanted}").into())
    }
}

impl Raw for MySqlRaw {
    fn claim_commit(
        &self,
        _worker: usize,
        consumer: Arc<str>,
        message_id: String,
    ) -> BoxFuture<'static, Result<bool>> {
        let inner = Arc::clone(&self.inner);
        async move {
            // Each statement on a connection of its own from the pool, as the store's are.
            let inserted = {
                let mut conn = inner.pool.acquire().await?;
                inner.try_insert(&mut conn, &consumer, &message_id).await?
            };
            if inserted {
                let mut conn = inner.pool.acquire().await?;
                inner.update(&mut conn, &consumer, &message_id).await?;
            }
            Ok(inserted)
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
            let now = now_ms();
            let rows = vec!["(?, ?, ?, 1, 1, ?, ?)"; message_ids.len()].join(", ");
            let insert = format!(
                "INSERT IGNORE INTO {} (consumer, message_id, token, fence, attempt, claimed_at, expires_at) \
                 VALUES {rows}",
                inner.table
            );
            let mut query = sqlx::query(AssertSqlSafe(insert));
            for id in &message_ids {
                query = query
                    .bind(&*consumer)
                    .bind(id)
                    .bind(token())
                    .bind(now)
                    .bind(now + RAW_LEASE_MS);
            }
            let inserted = query.execute(&inner.pool).await?;
            expect_rows("INSERT", inserted.rows_affected(), message_ids.len())?;
            let list = vec!["?"; message_ids.len()].join(", ");
            let update = format!(
                "UPDATE {} SET processed_at = ?, expires_at = NULL \
                 WHERE consumer = ? AND message_id IN ({list})",
                inner.table
            );
            let mut query = sqlx::query(AssertSqlSafe(update)).bind(now_ms()).bind(&*consumer);
            for id in &message_ids {
                query = query.bind(id);
            }
            let updated = query.execute(&inner.pool).await?;
            expect_rows("UPDATE", updated.rows_affected(), message_ids.len())
        }
        .boxed()
    }

    fn cleanup(&self) -> BoxFuture<'static, Result<()>> {
        let inner = Arc::clone(&self.inner);
        async move {
            for drop in &inner.drops {
                sqlx::raw_sql(AssertSqlSafe(drop.clone()))
                    .execute(&inner.pool)
                    .await?;
            }
            Ok(())
        }
        .boxed()
    }
}

/// The transactional mode: the store's `claim_in_tx` and the baselines on the raw
/// baseline's pool, each transaction at the server's default isolation (REPEATABLE READ).
struct MySqlTx {
    inner: Arc<Inner>,
    store: MySqlStore,
    inbox: TxInbox,
    /// The same `TxInbox`: its claim already commits as the store's own `claim` does.
    inbox_as_hand: TxInbox,
}

impl Transactional for MySqlTx {
    fn process(
        &self,
        flavor: TxFlavor,
        _worker: usize,
        consumer: Arc<str>,
        message_id: String,
    ) -> BoxFuture<'static, Result<()>> {
        let (inner, store) = (Arc::clone(&self.inner), self.store.clone());
        if matches!(flavor, TxFlavor::Inbox | TxFlavor::InboxAsHandWritten) {
            let inbox = if flavor == TxFlavor::Inbox {
                self.inbox.clone()
            } else {
                self.inbox_as_hand.clone()
            };
            return async move {
                let key = Key::new(&*consumer, &message_id)?;
                inbox
                    .handle(&key, None, |conn, _lease| {
                        let (inner, consumer) = (Arc::clone(&inner), Arc::clone(&consumer));
                        let id = message_id.clone();
                        Box::pin(async move {
                            inner.insert_business(conn, &consumer, &id).await?;
                            Ok::<_, BoxError>(None)
                        })
                    })
                    .await?;
                Ok(())
            }
            .boxed();
        }
        async move {
            let (consumer, id) = (&*consumer, message_id.as_str());
            if flavor == TxFlavor::HandWritten {
                let key = Key::new(consumer, id)?;
                let (store, inner) = (&store, &inner);
                return hand_written(store, &key, |lease| async move {
                    // On the store's pool, as `TxInbox` does: both then share its connections.
                    let mut tx = store.pool().begin().await?;
                    inner.insert_business(&mut tx, consumer, id).await?;
                    store.commit_in_tx(&mut tx, &lease, None).await?;
                    tx.commit().await?;
                    Ok(())
                })
                .await;
            }
            let mut tx = inner.pool.begin().await?;
            match flavor {
                TxFlavor::Library => {
                    let key = Key::new(consumer, id)?;
                    if let TxClaim::Claimed { .. } = store.claim_in_tx(&mut tx, &key, None).await? {
                        inner.insert_business(&mut tx, consumer, id).await?;
                    }
                }
                TxFlavor::BusinessOnly => inner.insert_business(&mut tx, consumer, id).await?,
                TxFlavor::Enqueue => {
                    inner.insert_business(&mut tx, consumer, id).await?;
                    let message = outbox_message(&format!("{consumer}/{id}"))?;
                    store.outbox().enqueue(&mut tx, &[message]).await?;
                }
                TxFlavor::Inbox | TxFlavor::InboxAsHandWritten | TxFlavor::HandWritten => {
                    unreachable!("handled above")
                }
                TxFlavor::TwoTransactions => {
                    // Insert the inbox row, or meet it, and commit. Insert first: a locking
                    // read of an absent row at REPEATABLE READ takes a gap lock, and two
                    // such transactions on neighbouring keys deadlock on their inserts.
                    inner.try_insert(&mut tx, consumer, id).await?;
                    tx.commit().await?;
                    // Lock it again, work, mark it consumed (committed below).
                    tx = inner.pool.begin().await?;
                    if inner.lock_row(&mut tx, consumer, id).await? == Some(false) {
                        inner.insert_business(&mut tx, consumer, id).await?;
                        inner.update(&mut tx, consumer, id).await?;
                    }
                }
            }
            tx.commit().await?;
            Ok(())
        }
        .boxed()
    }
}
