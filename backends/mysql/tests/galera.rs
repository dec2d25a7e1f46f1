//! The conformance suite (lease-mode, admin, transactional, `TxInbox` and outbox clauses,
//! the model-based test, the linearizability check) on a MariaDB Galera cluster
//! (`DEDUP_GALERA_URLS`, three nodes). Each clause's store spreads its pool over the three
//! nodes, so its operations, and the racing ones, run through different nodes. The three
//! tests where a second transaction must wait for a first one's row lock run on stores
//! pinned to one node (`galera/mod.rs`, `ONE_NODE`): Galera's row locks are the node's
//! own.

#[path = "galera/mod.rs"]
mod common;
#[path = "common/mod.rs"]
mod mysql_common;

use dedup_core::Key;
use dedup_mysql::sqlx::{self, MySql, MySqlConnection};
use dedup_mysql::{MySqlStore, TxInbox};

type Store = MySqlStore;
type Db = MySql;
/// The sqlx connection, for the shared outbox tests' handlers.
type Conn = MySqlConnection;

#[path = "../../sql/tests/clauses/factory.rs"]
mod factory;
use factory::{SqlFactory, seed_id};

#[path = "../../sql/tests/clauses/linearizability.rs"]
mod linearizability;

#[path = "../../sql/tests/clauses/outbox.rs"]
mod outbox;
use outbox::SqlOutboxFactory;

/// Nothing to set up before the conflicting run.
async fn before_conflict(_conn: &mut MySqlConnection) {}

/// A transaction on the handler's own node locks the seed row (Galera's row locks are the
/// node's own); then the handler's `FOR UPDATE NOWAIT` of it is refused
/// (`common::refused_lock`), which the inbox runs again. A conflict through two nodes,
/// found at `COMMIT`, is `galera_tx.rs`'s.
async fn conflict(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    key: &Key,
) -> std::result::Result<(), sqlx::Error> {
    let mut holder = common::connect_to(common::port_of(conn).await).await;
    mysql_common::refused_lock(store, &mut holder, conn, key, &seed_id(key)).await
}

dedup_conformance::suite!(SqlFactory);
dedup_conformance::admin_suite!(SqlFactory);
dedup_conformance::tx_inbox_suite!(SqlFactory);
dedup_conformance::outbox_suite!(SqlOutboxFactory);
dedup_conformance::transactional_suite!(SqlFactory);
