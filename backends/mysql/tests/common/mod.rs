//! Shared by the server-backed tests: the server URL, fresh stores and business tables.
#![allow(dead_code)] // each test binary uses a different part

use std::sync::Arc;

use dedup_core::{Clock, ManualClock};
use dedup_mysql::sqlx::{self, AssertSqlSafe, MySqlConnection};
use dedup_mysql::{MySqlConfig, MySqlStore};

/// `DEDUP_MYSQL_URL`, or `None` to skip (a failure under `DEDUP_TEST_STRICT=1`).
pub fn url() -> Option<String> {
    dedup_conformance::server_url("DEDUP_MYSQL_URL")
}

/// Skip the calling test (returning early) when no server is configured.
#[macro_export]
macro_rules! url_or_skip {
    () => {
        match common::url() {
            Some(url) => url,
            None => {
                eprintln!("SKIPPED: DEDUP_MYSQL_URL is not set (see scripts/test.sh)");
                return;
            }
        }
    };
}

/// A unique table name for `test`.
pub fn unique_table(test: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("t_{}_{}", &test[..test.len().min(20)], &id[..16])
}

/// A migrated store on a fresh table, on `clock` (`None`: the server's clock).
pub async fn store(url: &str, test: &str, clock: Option<Arc<dyn Clock>>) -> MySqlStore {
    store_on(url, &unique_table(test), clock).await
}

/// A migrated store on `table` (a second call gives an independent handle, own pool).
pub async fn store_on(url: &str, table: &str, clock: Option<Arc<dyn Clock>>) -> MySqlStore {
    let config = MySqlConfig {
        table: table.into(),
        clock,
        max_connections: 8,
        ..MySqlConfig::default()
    };
    MySqlStore::connect_with(url, config)
        .await
        .expect("connect and migrate")
}

/// A manual clock standing at the current time.
pub fn manual_clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::starting_now())
}

/// The business table standing for the caller's own data next to `store`'s inbox table.
pub fn business_table(store: &MySqlStore) -> String {
    format!("`{}_biz`", store.config().table)
}

/// Create `store`'s business table (idempotent).
pub async fn create_business_table(store: &MySqlStore) {
    let ddl = format!(
        "CREATE TABLE IF NOT EXISTS {} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, \
         consumer VARBINARY(200) NOT NULL, message_id VARBINARY(255) NOT NULL, \
         label VARCHAR(200) NOT NULL, KEY by_key (consumer, message_id)) ENGINE = InnoDB",
        business_table(store)
    );
    sqlx::raw_sql(AssertSqlSafe(ddl))
        .execute(store.pool())
        .await
        .expect("create business table");
}

/// Insert a business row `(key, label)` on `conn` (inside the caller's transaction).
pub async fn insert_business_row(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    key: &dedup_core::Key,
    label: &str,
) {
    let sql = format!(
        "INSERT INTO {} (consumer, message_id, label) VALUES (?, ?, ?)",
        business_table(store)
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(key.consumer())
        .bind(key.message_id())
        .bind(label)
        .execute(conn)
        .await
        .expect("insert business row");
}

/// The committed business rows of `key`, in insertion order.
pub async fn business_rows(store: &MySqlStore, key: &dedup_core::Key) -> Vec<String> {
    let sql = format!(
        "SELECT label FROM {} WHERE consumer = ? AND message_id = ? ORDER BY seq",
        business_table(store)
    );
    sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(key.consumer())
        .bind(key.message_id())
        .fetch_all(store.pool())
        .await
        .expect("read business rows")
}
