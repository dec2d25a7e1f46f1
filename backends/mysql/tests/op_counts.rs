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
//! and operations run one at a time.

mod common;

use dedup_conformance::counting::{
    Cost, LeaseCosts, Protocol, check_lease_mode, check_purge_batch,
};
use dedup_mysql::{MySqlStore, TxInbox};

type Store = MySqlStore;

#[path = "../../sql/tests/clauses/op_counts.rs"]
mod sql_counts;
use sql_counts::{OutboxCosts, TxCosts, check_outbox, check_transactional, guarded_store};

const BACKEND: &str = "mysql";

/// The expected cost of each operation measured below.
const LEASE_MODE: LeaseCosts = LeaseCosts {
    claim_fresh: Cost::new(1, 1, 1),
    claim_in_flight: Cost::new(4, 4, 2),
    claim_completed: Cost::new(4, 4, 2),
    claim_expired: Cost::new(5, 5, 2),
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
    take: Cost::new(4, 4, 1),
    mark_sent: Cost::new(4, 4, 1),
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operation_costs_what_it_did() {
    let url = url_or_skip!();
    let (store, mut g) = guarded_store(&url, Protocol::MySql, BACKEND).await;
    check_lease_mode(&mut g, &store, &LEASE_MODE).await;
    check_purge_batch(&mut g, &store, PURGE_ONE_BATCH).await;
    check_transactional(&mut g, &store, &TRANSACTIONAL).await;
    check_outbox(&mut g, &store, &OUTBOX).await;
    g.finish();
}

/// With kept counts (`Admin::enable_counts`) the triggers clear the insert id the server
/// reports: a claim of a new key and a renewal read the session's `LAST_INSERT_ID()` in one
/// more round trip, and a transactional claim of a new key (so `TxInbox::handle`) reads
/// its record. Nothing else changes.
const LEASE_MODE_KEPT: LeaseCosts = LeaseCosts {
    claim_fresh: Cost::new(2, 2, 1),
    renew: Cost::new(2, 2, 1),
    claim_many_100: Cost::new(2, 2, 1),
    ..LEASE_MODE
};
const TRANSACTIONAL_KEPT: TxCosts = TxCosts {
    claim_in_tx: Cost::new(2, 2, 0),
    tx_inbox_handle: Cost::new(5, 5, 2),
    ..TRANSACTIONAL
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operation_costs_what_it_did_with_counts_kept() {
    use dedup_core::Admin;
    let url = url_or_skip!();
    let (store, mut g) = guarded_store(&url, Protocol::MySql, BACKEND).await;
    assert!(store.enable_counts().await.expect("enable counts"));
    check_lease_mode(&mut g, &store, &LEASE_MODE_KEPT).await;
    check_transactional(&mut g, &store, &TRANSACTIONAL_KEPT).await;
    g.finish();
}
