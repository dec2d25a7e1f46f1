//! Database conflicts in `TxInbox` on PostgreSQL (`DEDUP_POSTGRES_URL`): deadlocks
//! (`40P01`) and refused locks (`55P03`) are run again under the same lease. The clauses
//! are shared by the sqlx backends (`backends/sql/tests/clauses/tx_conflicts.rs`); the
//! stock table they lock is this file's.

mod common;

use dedup_postgres::sqlx::{self, PgConnection, Postgres};
use dedup_postgres::{PostgresStore, TxInbox};

/// The sqlx database.
type Db = Postgres;
/// The connection a handler runs on.
type Conn = PgConnection;

/// The stock table beside `store`'s inbox table, quoted.
fn stock(store: &PostgresStore) -> String {
    format!("\"{}\".\"{}_stock\"", common::SCHEMA, store.config().table)
}

/// What ends the stock table's `CREATE TABLE`.
const STOCK_TABLE_OPTIONS: &str = "";

/// The first statement parameter.
const ID_PARAM: &str = "$1";

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
