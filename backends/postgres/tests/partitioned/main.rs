//! The partitioned layout ([`Partitions`]) against the real PostgreSQL of
//! `DEDUP_POSTGRES_URL`: the conformance suite (all but the clauses of the exact purge,
//! which a ring does by whole partitions, and the model-based test without purges), the
//! linearizability check with windows of 20 ms (first claims of one key straddle window
//! boundaries all the time), and the retirement of partitions.

mod common;

use std::sync::Arc;
use std::time::Duration;

use dedup_conformance::StoreFactory;
use dedup_conformance::clauses::{Clause, admin_clauses, lease_clauses};
use dedup_conformance::linearizability::{Workload, assert_linearizable};
use dedup_core::SystemClock;
use dedup_postgres::sqlx::{self, Postgres};
use dedup_postgres::{Partitions, PostgresStore, TxInbox};

type Store = PostgresStore;
type Db = Postgres;

/// The ring of the conformance and linearizability runs: windows of 20 ms, 8 partitions.
pub const PARTITIONS: Partitions = Partitions {
    window: Duration::from_millis(20),
    count: 8,
};

#[path = "../../../sql/tests/clauses/factory.rs"]
mod factory;
use factory::{SqlFactory, seed_id};

#[path = "../common/conflict.rs"]
mod conflict_steps;
use conflict_steps::{before_conflict, conflict};

mod retire;

/// The clauses of the plain layout's purge: it removes each record the moment it is past
/// retention, in batches of a given size, with retentions up to an hour. A ring removes
/// whole partitions, so a record is kept up to one window longer, and this ring keeps at
/// most 120 ms; `retire.rs` tests what it does instead.
const EXACT_PURGE: &[&str] = &[
    "purge_removes_only_what_is_past_retention",
    "purge_never_removes_a_live_lease",
    "purge_works_in_batches_and_reports_counts",
    "concurrent_purges_remove_each_record_once",
    "a_purged_key_starts_afresh_and_its_old_lease_is_lost",
    "a_default_purge_is_paced_and_removes_every_old_record",
    "purgers_remove_old_records_once_and_keep_live_leases",
    "model_based_histories_match_memory_store",
    "count_purgeable_equals_what_purge_removes",
    "a_finished_purge_is_kept_as_the_last_run",
];

/// Run `clauses` but the exact purge's, in turn; each excluded name must exist.
async fn run_all_but_exact_purge(clauses: Vec<Clause<SqlFactory>>, part: usize, parts: usize) {
    if !SqlFactory.available() {
        eprintln!(
            "SKIPPED: {} is not set (see scripts/test.sh)",
            common::URL_VAR
        );
        return;
    }
    for (i, clause) in clauses.iter().enumerate() {
        if i % parts != part || EXACT_PURGE.contains(&clause.name) {
            continue;
        }
        eprintln!("clause {}", clause.name);
        (clause.run)(&SqlFactory).await;
    }
}

#[test]
fn every_excluded_clause_exists() {
    let names: Vec<&str> = lease_clauses::<SqlFactory>()
        .iter()
        .chain(admin_clauses::<SqlFactory>().iter())
        .map(|c| c.name)
        .collect();
    for excluded in EXACT_PURGE {
        assert!(names.contains(excluded), "{excluded} is no clause any more");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_clauses_part_1() {
    run_all_but_exact_purge(lease_clauses(), 0, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_clauses_part_2() {
    run_all_but_exact_purge(lease_clauses(), 1, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_clauses_part_3() {
    run_all_but_exact_purge(lease_clauses(), 2, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_clauses_but_exact_purge() {
    run_all_but_exact_purge(admin_clauses(), 0, 1).await;
}

/// The model-based test without purges; fewer cases than the plain layout's (each case
/// creates a table of 8 partitions and its claim function).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn model_based_histories_without_purges_match_memory_store() {
    if !SqlFactory.available() {
        eprintln!(
            "SKIPPED: {} is not set (see scripts/test.sh)",
            common::URL_VAR
        );
        return;
    }
    let mut config = dedup_conformance::model::model_config();
    config.cases = 64;
    dedup_conformance::model::check_histories_without_purges(&SqlFactory, config).await;
}

dedup_conformance::transactional_suite!(SqlFactory);
dedup_conformance::tx_inbox_suite!(SqlFactory);

/// Recorded concurrent histories on a ring of 20 ms windows are linearizable: four
/// handles, each its own pool, on the server's clock, leases of 15 to 60 ms. First claims
/// of a key from two tasks straddle a window boundary in most epochs; the claim function's
/// key lock and look-up of every partition keep them to one acquisition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn linearizable_histories_across_window_boundaries() {
    let url = crate::url_or_skip!();
    let table = common::unique_table("ring_linearizable");
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(Arc::new(common::store_on(&url, &table, None).await));
    }
    let workload = Workload {
        calls_per_task: 120,
        ..Workload::default()
    };
    assert_linearizable(stores.clone(), Arc::new(SystemClock), &workload).await;
    // The run spread its records over the ring.
    let slots: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(DISTINCT slot) FROM {}",
        stores[0].table()
    )))
    .fetch_one(stores[0].pool())
    .await
    .expect("count slots");
    assert!(
        slots > 1,
        "every record in one partition: no boundary was crossed"
    );
}
