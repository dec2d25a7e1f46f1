//! Database conflicts in `TxInbox` on MySQL / MariaDB (`DEDUP_MYSQL_URL`): deadlocks
//! (1213) and refused locks (1205, `NOWAIT`) are run again under the same lease. The
//! clauses are shared by the sqlx backends (`backends/sql/tests/clauses/tx_conflicts.rs`);
//! the stock table they lock is this file's.

mod common;

use dedup_mysql::sqlx::{self, AssertSqlSafe, MySql, MySqlConnection};
use dedup_mysql::{MySqlStore, TxInbox};

/// The sqlx database.
type Db = MySql;
/// The connection a handler runs on.
type Conn = MySqlConnection;

/// The stock table beside `store`'s inbox table: two rows the handlers lock.
fn stock(store: &MySqlStore) -> String {
    format!("`{}_stock`", store.config().table)
}

/// Create the stock table with its rows 1 and 2.
async fn create_stock(store: &MySqlStore) {
    for sql in [
        format!(
            "CREATE TABLE {} (id BIGINT PRIMARY KEY, qty BIGINT NOT NULL) ENGINE = InnoDB",
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

/// Lock and update stock row `?`.
fn bump_sql(store: &MySqlStore) -> String {
    format!("UPDATE {} SET qty = qty + 1 WHERE id = ?", stock(store))
}

/// Lock stock row `?` or fail at once (1205 on MariaDB) if another transaction holds it.
fn lock_nowait_sql(store: &MySqlStore) -> String {
    format!(
        "SELECT qty FROM {} WHERE id = ? FOR UPDATE NOWAIT",
        stock(store)
    )
}

/// First in a deadlocking handler's transaction: nothing (InnoDB finds deadlocks at once).
async fn before_locking(_conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
    Ok(())
}

#[path = "../../sql/tests/clauses/tx_conflicts.rs"]
mod clauses;
