//! A regression guard on what each operation costs on the wire: exact round trips,
//! statements and prepares per operation, counted by a
//! [`CountingProxy`](dedup_conformance::counting::CountingProxy) between one store and the
//! server (see BENCHMARKS.md, "Wire cost guard"). A change that adds a round trip or a
//! statement fails here with the operation's name; if the change is meant, update the
//! number here and the table in BENCHMARKS.md.
//!
//! The scenario past the lease mode is the sqlx backends' shared one
//! (`../../sql/tests/clauses/op_counts.rs`). Deterministic: only this store talks through the proxy; its pool has one connection (so
//! every call finds the same connection and its prepared statements); every operation runs
//! once on other keys before it is measured (the first use of a statement prepares it),
//! and operations run one at a time, so group commit never groups.

mod common;

use dedup_conformance::counting::{
    Cost, LeaseCosts, Protocol, check_lease_mode, check_purge_batch,
};
use dedup_postgres::{PostgresStore, TxInbox};

type Store = PostgresStore;

#[path = "../../sql/tests/clauses/op_counts.rs"]
mod sql_counts;
use sql_counts::{OutboxCosts, TxCosts, check_outbox, check_transactional, guarded_store};

const BACKEND: &str = "postgres";

/// The expected cost of each operation measured below.
const LEASE_MODE: LeaseCosts = LeaseCosts {
    claim_fresh: Cost::new(1, 1, 1),
    claim_in_flight: Cost::new(2, 2, 1),
    claim_completed: Cost::new(2, 2, 1),
    claim_expired: Cost::new(3, 3, 1),
    renew: Cost::new(1, 1, 1),
    commit: Cost::new(1, 1, 1),
    release: Cost::new(1, 1, 1),
    claim_many_100: Cost::new(1, 1, 1),
    commit_many_100: Cost::new(1, 1, 1),
};
/// The batch, then the run kept as the store's last (`Admin::last_purge`).
const PURGE_ONE_BATCH: Cost = Cost::new(2, 2, 2);
const TRANSACTIONAL: TxCosts = TxCosts {
    claim_in_tx: Cost::new(1, 1, 0),
    commit_in_tx: Cost::new(1, 1, 0),
    tx_inbox_handle: Cost::new(4, 4, 2),
};
const OUTBOX: OutboxCosts = OutboxCosts {
    enqueue: Cost::new(1, 1, 0),
    take: Cost::new(1, 1, 1),
    mark_sent: Cost::new(1, 1, 1),
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operation_costs_what_it_did() {
    let url = url_or_skip!();
    let (store, mut g) = guarded_store(&url, Protocol::Postgres, BACKEND).await;
    check_lease_mode(&mut g, &store, &LEASE_MODE).await;
    check_purge_batch(&mut g, &store, PURGE_ONE_BATCH).await;
    check_transactional(&mut g, &store, &TRANSACTIONAL).await;
    check_outbox(&mut g, &store, &OUTBOX).await;
    g.finish();
}
