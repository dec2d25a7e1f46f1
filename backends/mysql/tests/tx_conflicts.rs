//! Database conflicts in `TxInbox` on MySQL / MariaDB (`DEDUP_MYSQL_URL`): deadlocks
//! (1213) and refused locks (1205, `NOWAIT`) are run again under the same lease. The
//! clauses are shared by the sqlx backends (`backends/sql/tests/clauses/tx_conflicts.rs`);
//! the stock table they lock is this file's.

mod common;

use dedup_core::Key;
use dedup_mysql::sqlx::{self, AssertSqlSafe, MySql, MySqlConnection};
use dedup_mysql::{MySqlStore, TxInbox};
use futures::future::BoxFuture;

/// The sqlx database.
type Db = MySql;
/// The connection a handler runs on.
type Conn = MySqlConnection;

/// The stock table beside `store`'s inbox table, quoted.
fn stock(store: &MySqlStore) -> String {
    format!("`{}_stock`", store.config().table)
}

/// What ends the stock table's `CREATE TABLE`.
const STOCK_TABLE_OPTIONS: &str = " ENGINE = InnoDB";

/// The first statement parameter.
const ID_PARAM: &str = "?";

/// First in a deadlocking handler's transaction: nothing (InnoDB finds deadlocks at once).
async fn before_locking(_conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
    Ok(())
}

#[path = "../../sql/tests/clauses/tx_conflicts.rs"]
mod clauses;

/// The shipment service's handler as its user wrote it: a locking read of the message's
/// business row (absent, so at REPEATABLE READ it locks the gap), then the insert.
/// Concurrent runs into the same gap deadlock (1213).
fn read_then_insert<'c>(
    store: &'c MySqlStore,
    conn: &'c mut MySqlConnection,
    key: &'c Key,
    _id: usize,
) -> BoxFuture<'c, Result<Option<Vec<u8>>, sqlx::Error>> {
    let table = common::business_table(store);
    Box::pin(async move {
        sqlx::query(AssertSqlSafe(format!(
            "SELECT label FROM {table} WHERE consumer = ? AND message_id = ? FOR UPDATE"
        )))
        .bind(key.consumer())
        .bind(key.message_id())
        .fetch_all(&mut *conn)
        .await?;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (consumer, message_id, label) VALUES (?, ?, 'reserved')"
        )))
        .bind(key.consumer())
        .bind(key.message_id())
        .execute(&mut *conn)
        .await?;
        Ok(None)
    })
}

#[test]
fn select_for_update_then_insert_deadlocks_are_run_again_without_dead_letters() {
    clauses::deadlocking_workers_process_each_message_once("gap_locks", false, read_then_insert);
}
