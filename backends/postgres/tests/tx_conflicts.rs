//! Database conflicts in `TxInbox` on PostgreSQL (`DEDUP_POSTGRES_URL`): deadlocks
//! (`40P01`) and refused locks (`55P03`) are run again under the same lease. The clauses
//! are shared by the sqlx backends (`backends/sql/tests/clauses/tx_conflicts.rs`); the
//! stock table they lock is this file's.

mod common;

use dedup_postgres::sqlx::{self, AssertSqlSafe, PgConnection, Postgres};
use dedup_postgres::{PostgresStore, TxInbox};

/// The sqlx database.
type Db = Postgres;
/// The connection a handler runs on.
type Conn = PgConnection;

/// The stock table beside `store`'s inbox table: two rows the handlers lock.
fn stock(store: &PostgresStore) -> String {
    format!("\"{}\".\"{}_stock\"", common::SCHEMA, store.config().table)
}

/// Create the stock table with its rows 1 and 2.
async fn create_stock(store: &PostgresStore) {
    for sql in [
        format!(
            "CREATE TABLE {} (id bigint PRIMARY KEY, qty bigint NOT NULL)",
            stock(store)
        ),
        format!("INSERT INTO {} VALUES (1, 0), (2, 0)", stock(store)),
    ] {
        sqlx::query(AssertSqlSafe(sql))
            .execute(store.pool())
            .await
            .expect("stock table");
    }
}

/// Lock and update stock row `$1`.
fn bump_sql(store: &PostgresStore) -> String {
    format!("UPDATE {} SET qty = qty + 1 WHERE id = $1", stock(store))
}

/// Lock stock row `$1` or fail at once (`55P03`) if another transaction holds it.
fn lock_nowait_sql(store: &PostgresStore) -> String {
    format!(
        "SELECT qty FROM {} WHERE id = $1 FOR UPDATE NOWAIT",
        stock(store)
    )
}

/// First in a deadlocking handler's transaction: find deadlocks after 20 ms instead of
/// the server's 1 s, so the test stays short.
async fn before_locking(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SET LOCAL deadlock_timeout = '20ms'")
        .execute(conn)
        .await
        .map(drop)
}

#[path = "../../sql/tests/clauses/tx_conflicts.rs"]
mod clauses;
