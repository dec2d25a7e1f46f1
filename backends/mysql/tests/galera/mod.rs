//! Shared by the Galera tests (`tests/galera*.rs`): the cluster's nodes
//! (`DEDUP_GALERA_URLS`), and stores whose pools spread their connections over the three
//! nodes, so consecutive and concurrent operations of one store run through different
//! nodes. Each including file declares `mysql_common` (`tests/common/mod.rs`: the business
//! table).
#![allow(dead_code)] // each test binary uses a different part

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dedup_core::Clock;
use dedup_mysql::sqlx::mysql::MySqlConnectOptions;
use dedup_mysql::sqlx::{self, AssertSqlSafe, Connection, MySqlConnection};
use dedup_mysql::{MySqlStore, pool_options};

#[allow(unused_imports)] // each test binary uses a different part
pub use super::mysql_common::{
    Store, business_rows, business_table, config, create_business_table, insert_business_row,
    unique_table,
};

/// The variable naming the three nodes' URLs, comma-separated.
pub const URL_VAR: &str = "DEDUP_GALERA_URLS";

/// Connections per store: two on each node.
const CONNECTIONS: usize = 6;

/// Node 1's URL, or `None` to skip (a failure under `DEDUP_TEST_STRICT=1`). The stores of
/// [`store_on`] use every node whatever URL they are given.
pub fn url() -> Option<String> {
    dedup_conformance::server_url(URL_VAR).map(|urls| first(&urls))
}

fn first(urls: &str) -> String {
    urls.split(',').next().unwrap_or_default().to_owned()
}

/// The nodes' URLs, in node order.
pub fn urls() -> Vec<String> {
    let urls = dedup_conformance::server_url(URL_VAR).expect("DEDUP_GALERA_URLS");
    urls.split(',').map(str::to_owned).collect()
}

/// A migrated store on a fresh table, on `clock` (`None`: the servers' clocks).
pub async fn store(url: &str, test: &str, clock: Option<Arc<dyn Clock>>) -> Store {
    store_on(url, &unique_table(test), clock).await
}

/// The tests whose stores are pinned to one node: a second transaction must wait for a
/// first one's row lock, and Galera's row locks are the node's own (through two nodes the
/// later `COMMIT` fails with a conflict instead: `galera_tx.rs`).
const ONE_NODE: [&str; 3] = [
    "concurrent_tx_claims_of_one_key_write_one_business_row",
    "a_tx_claim_waiting_on_a_rolled_back_one_claims",
    "outbox::producers_of_one_ordering_key_take_turns",
];

/// Which node the next pinned store uses.
static NEXT_NODE: AtomicUsize = AtomicUsize::new(0);

/// A store on `table` (migrated through node 1). Its pool holds two connections to each
/// node, handed out in turn; for the tests of [`ONE_NODE`] (named by the test's thread),
/// all of them go to one node, the next in turn for each call.
pub async fn store_on(_url: &str, table: &str, clock: Option<Arc<dyn Clock>>) -> Store {
    let urls = urls();
    let test = std::thread::current().name().unwrap_or_default().to_owned();
    if ONE_NODE.contains(&test.as_str()) {
        let node = NEXT_NODE.fetch_add(1, Ordering::Relaxed) % urls.len();
        node_store(&urls[node], table, clock).await
    } else {
        spread_store(&urls, table, clock).await
    }
}

/// A store on `table` whose connections all go to the node of `url`, migrating the table.
pub async fn node_store(url: &str, table: &str, clock: Option<Arc<dyn Clock>>) -> Store {
    let mut config = config(table);
    config.clock = clock;
    config.max_connections = CONNECTIONS as u32;
    Store::connect_with(url, config)
        .await
        .expect("connect and migrate")
}

/// A store on `table` whose pool holds [`CONNECTIONS`] connections spread over the nodes
/// of `urls` in turn (sqlx hands idle connections out first in, first out). A connection
/// that breaks is replaced by one to the last node.
pub async fn spread_store(urls: &[String], table: &str, clock: Option<Arc<dyn Clock>>) -> Store {
    let migrated = node_store(&urls[0], table, clock.clone()).await;
    migrated.pool().close().await;
    let mut config = config(table);
    config.clock = clock;
    config.max_connections = CONNECTIONS as u32;
    let options: Vec<MySqlConnectOptions> = urls
        .iter()
        .map(|u| u.parse().expect("a node URL"))
        .collect();
    let pool = pool_options(&config).connect_lazy_with(options[0].clone());
    let mut held = Vec::new();
    for i in 0..CONNECTIONS {
        pool.set_connect_options(options[i % options.len()].clone());
        held.push(pool.acquire().await.expect("a connection to each node"));
    }
    drop(held);
    MySqlStore::from_pool(pool, config)
        .await
        .expect("a store over the spread pool")
}

/// The SQL port of the node `conn` is connected to.
pub async fn port_of(conn: &mut MySqlConnection) -> u16 {
    let port: u64 = sqlx::query_scalar("SELECT @@port")
        .fetch_one(conn)
        .await
        .expect("the node's port");
    u16::try_from(port).expect("a port")
}

/// A plain connection to the node on `port`.
pub async fn connect_to(port: u16) -> MySqlConnection {
    let url = urls()
        .into_iter()
        .find(|u| u.contains(&format!(":{port}/")))
        .expect("the node");
    MySqlConnection::connect(&url)
        .await
        .expect("a connection to the node")
}

/// The node's status variable `name` (`SHOW STATUS` answers out of the primary component
/// too), or "" when it has none.
pub async fn status(conn: &mut MySqlConnection, name: &str) -> Result<String, sqlx::Error> {
    let row: Option<(String, String)> =
        sqlx::query_as(AssertSqlSafe(format!("SHOW STATUS LIKE '{name}'")))
            .fetch_optional(conn)
            .await?;
    Ok(row.map(|(_, value)| value).unwrap_or_default())
}

/// What each node says of itself, for a failure's message: `node 2: Primary, Synced, 3
/// members`, or why it did not answer (a node that died is `connection refused`; its
/// error log says why, and `scripts/services.sh report` shows it).
pub async fn cluster_state() -> String {
    let mut nodes = Vec::new();
    for (i, url) in urls().iter().enumerate() {
        let state = match MySqlConnection::connect(url).await {
            Ok(mut conn) => node_state(&mut conn)
                .await
                .unwrap_or_else(|e| format!("status unreadable: {e}")),
            Err(e) => format!("unreachable: {e}"),
        };
        nodes.push(format!("node {}: {state}", i + 1));
    }
    nodes.join("; ")
}

async fn node_state(conn: &mut MySqlConnection) -> Result<String, sqlx::Error> {
    Ok(format!(
        "{}, {}, {} members",
        status(conn, "wsrep_cluster_status").await?,
        status(conn, "wsrep_local_state_comment").await?,
        status(conn, "wsrep_cluster_size").await?
    ))
}
