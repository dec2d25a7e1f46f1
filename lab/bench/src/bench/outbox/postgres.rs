//! The PostgreSQL side of the outbox rows: the producer's transaction, the enqueue measure
//! and its diagnostics, and the prefill the relay measures start from.

use dedup_postgres::PostgresOutbox;
use dedup_postgres::sqlx::{self, AssertSqlSafe, PgPool, SqlSafeStr};
use futures::FutureExt;
use serde_json::json;

use crate::bench::driver::drive;
use crate::bench::rounds::{best_of, contender};
use crate::bench::{Params, Result, Row};

use super::support::{enqueue_row, message};

/// Rows per producer transaction when pre-filling the outbox (not measured).
const PREFILL_CHUNK: usize = 500;

pub(super) async fn exec(pool: &PgPool, sql: String) -> Result<()> {
    sqlx::raw_sql(SqlSafeStr::into_sql_str(AssertSqlSafe(sql)))
        .execute(pool)
        .await?;
    Ok(())
}

pub(super) async fn postgres_settings(pool: &PgPool) -> Result<String> {
    let mut out = Vec::new();
    for name in ["fsync", "synchronous_commit"] {
        let (value,): (String,) = sqlx::query_as(SqlSafeStr::into_sql_str(AssertSqlSafe(format!(
            "SHOW {name}"
        ))))
        .fetch_one(pool)
        .await?;
        out.push(format!("{name}={value}"));
    }
    Ok(out.join(" "))
}

/// What a PostgreSQL producer transaction writes besides its business row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Extra {
    /// Nothing: the business row alone.
    Nothing,
    /// One message through `PostgresOutbox::enqueue`.
    Enqueue,
    /// The same outbox row by a plain `INSERT`, without `enqueue`'s `pg_notify`: where
    /// `enqueue`'s cost goes (diagnostic).
    RowWithoutNotify,
    /// A `SELECT 1`: the price of one more round trip in the transaction (diagnostic).
    RoundTrip,
}

/// The PostgreSQL side: the store's pool and outbox, and the business insert.
#[derive(Clone)]
pub(super) struct Pg {
    pub(super) pool: PgPool,
    pub(super) outbox: PostgresOutbox,
    pub(super) insert: String,
    pub(super) setup: String,
}

impl Pg {
    /// One transaction: the business row, and `extra`.
    pub(super) async fn write(&self, id: String, extra: Extra, destination: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(SqlSafeStr::into_sql_str(AssertSqlSafe(self.insert.clone())))
            .bind(&id)
            .bind(100_i32)
            .execute(&mut *tx)
            .await?;
        match extra {
            Extra::Nothing => {}
            Extra::RoundTrip => {
                sqlx::query("SELECT 1").execute(&mut *tx).await?;
            }
            Extra::Enqueue => {
                self.outbox
                    .enqueue(&mut tx, &[message(destination, id)?])
                    .await?;
            }
            Extra::RowWithoutNotify => {
                let m = message(destination, id)?;
                let sql = format!(
                    "INSERT INTO {} (destination, message_id, headers, payload, ordering_key, \
                     written_at, due_at, attempts, state) \
                     SELECT $1, $2, $3::jsonb, $4, NULL, ms, ms, 0, 'pending' \
                     FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms) now \
                     ON CONFLICT (message_id) DO NOTHING",
                    self.outbox.table()
                );
                sqlx::query(SqlSafeStr::into_sql_str(AssertSqlSafe(sql)))
                    .bind(m.destination())
                    .bind(m.message_id())
                    .bind(serde_json::to_string(m.headers())?)
                    .bind(m.payload())
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }
}

/// Measure 2a on PostgreSQL, and two diagnostics: the outbox row without `NOTIFY`, and
/// the business row plus a `SELECT 1` (one more round trip, no work).
pub(super) async fn pg_enqueue(params: &Params, pg: &Pg) -> Result<Vec<Row>> {
    let n = params.messages;
    let mut rows = Vec::new();
    for &c in &params.concurrency {
        let run = |extra: Extra, what: String, n: usize| {
            let pg = pg.clone();
            drive(
                c,
                move |i| i < n,
                move |_, i| {
                    let pg = pg.clone();
                    let id = format!("{what}-{i}");
                    async move { pg.write(id, extra, "/nowhere").await }
                },
            )
            .boxed()
        };
        let kinds = [
            (Extra::Enqueue, "enqueue"),
            (Extra::Nothing, "alone"),
            (Extra::RowWithoutNotify, "no-notify"),
            (Extra::RoundTrip, "round-trip"),
        ];
        for (extra, what) in kinds {
            run(extra, format!("warm-c{c}-{what}"), params.warmup).await?;
        }
        let run = &run;
        let runs = best_of(
            params,
            kinds
                .iter()
                .map(|&(extra, what)| {
                    contender(move |round| run(extra, format!("c{c}-{what}-{round}"), n))
                })
                .collect(),
        )
        .await?;
        let mut row = enqueue_row("postgres", c, n, &runs, &pg.setup);
        row.details.insert(
            "row_without_notify_msgs_per_s".into(),
            json!(runs[2].throughput(n)),
        );
        row.details.insert(
            "one_more_round_trip_msgs_per_s".into(),
            json!(runs[3].throughput(n)),
        );
        rows.push(row);
    }
    Ok(rows)
}

/// Fill the outbox with `n` messages for `destination`, ids `prefix-0...`.
pub(super) async fn prefill(pg: &Pg, destination: &str, prefix: &str, n: usize) -> Result<()> {
    let mut i = 0;
    while i < n {
        let end = n.min(i + PREFILL_CHUNK);
        let messages = (i..end)
            .map(|k| message(destination, format!("{prefix}-{k}")))
            .collect::<Result<Vec<_>>>()?;
        let mut tx = pg.pool.begin().await?;
        pg.outbox.enqueue(&mut tx, &messages).await?;
        tx.commit().await?;
        i = end;
    }
    Ok(())
}
