//! `outbox_enqueue_vs_insert_alone` on MySQL / MariaDB (`DEDUP_MYSQL_URL`): one business
//! row plus one `enqueue` in one transaction, against the business row alone, on the
//! server as it is set (its `innodb_flush_log_at_trx_commit` is printed with the row).

use dedup_mysql::sqlx::{self, AssertSqlSafe, MySqlPool};
use dedup_mysql::{MySqlConfig, MySqlOutbox, MySqlStore, SqlSettings};
use futures::FutureExt;

use super::support::{enqueue_row, message};
use crate::bench::driver::drive;
use crate::bench::rounds::{best_of, contender};
use crate::bench::{Names, Params, Result, Row};

/// The MySQL side: the store's pool and outbox, and the business insert.
#[derive(Clone)]
struct My {
    pool: MySqlPool,
    outbox: MySqlOutbox,
    insert: String,
}

impl My {
    /// One transaction: the business row, and one message when `with_outbox`.
    async fn write(&self, id: String, with_outbox: bool) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(AssertSqlSafe(self.insert.clone()))
            .bind(&id)
            .bind(100_i32)
            .execute(&mut *tx)
            .await?;
        if with_outbox {
            self.outbox
                .enqueue(&mut tx, &[message("/nowhere", id)?])
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// The enqueue row at each concurrency, on a fresh table set that is dropped afterwards.
pub(crate) async fn mysql_enqueue(params: &Params, url: &str, names: &Names) -> Result<Vec<Row>> {
    let table = format!("dedup_bench_{}_ob", names.run);
    let store = MySqlStore::connect_with(
        url,
        MySqlConfig::from(SqlSettings {
            table: table.clone(),
            max_connections: params.max_concurrency() as u32 + 4,
            ..Default::default()
        }),
    )
    .await?;
    let business = format!("{table}_biz");
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE `{business}` (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
         message_id VARCHAR(255) NOT NULL, amount INT NOT NULL) ENGINE = InnoDB"
    )))
    .execute(store.pool())
    .await?;
    let (version, flush): (String, i64) =
        sqlx::query_as("SELECT VERSION(), CAST(@@innodb_flush_log_at_trx_commit AS SIGNED)")
            .fetch_one(store.pool())
            .await?;
    let my = My {
        pool: store.pool().clone(),
        outbox: store.outbox(),
        insert: format!("INSERT INTO `{business}` (message_id, amount) VALUES (?, ?)"),
    };
    let setup = format!("{version}, innodb_flush_log_at_trx_commit={flush}, table {table}");
    let measured = measure(params, &my, &setup).await;
    let outbox = store.config().outbox_table_name();
    for t in [
        business,
        table.clone(),
        outbox.clone(),
        format!("{outbox}_keys"),
    ] {
        sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS `{t}`")))
            .execute(store.pool())
            .await?;
    }
    sqlx::query("DELETE FROM dedup_schema_versions WHERE table_name IN (?, ?)")
        .bind(&table)
        .bind(&outbox)
        .execute(store.pool())
        .await?;
    measured
}

async fn measure(params: &Params, my: &My, setup: &str) -> Result<Vec<Row>> {
    let n = params.messages;
    let mut rows = Vec::new();
    for &c in &params.concurrency {
        let run = |with_outbox: bool, what: String, n: usize| {
            let my = my.clone();
            drive(
                c,
                move |i| i < n,
                move |_, i| {
                    let my = my.clone();
                    let id = format!("{what}-{i}");
                    async move { my.write(id, with_outbox).await }
                },
            )
            .boxed()
        };
        let kinds = [(true, "enqueue"), (false, "alone")];
        for (with_outbox, what) in kinds {
            run(with_outbox, format!("warm-c{c}-{what}"), params.warmup).await?;
        }
        let run = &run;
        let runs = best_of(
            params,
            kinds
                .iter()
                .map(|&(with_outbox, what)| {
                    contender(move |round| run(with_outbox, format!("c{c}-{what}-{round}"), n))
                })
                .collect(),
        )
        .await?;
        rows.push(enqueue_row("mysql", c, n, &runs, setup));
    }
    Ok(rows)
}
