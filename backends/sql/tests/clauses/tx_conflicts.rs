//! Database conflicts in `TxInbox`, the same on every sqlx backend, on real servers:
//! deadlocks under concurrent workers are run again under the same lease (no attempt
//! used, no dead letter), conflicts that outlast the retries use one attempt and are kept
//! as kind `conflict`, and `with_begin` (the user's own transactions) commits only a
//! successful run. Each backend's `tests/tx_conflicts.rs` includes this file as a module
//! (`#[path]`) beside its `common` helpers, its `TxInbox`, the aliases `Db` and `Conn`,
//! and what its stock table's SQL needs (`stock`, `STOCK_TABLE_OPTIONS`, `ID_PARAM`,
//! `before_locking`). Not a test target of its own (cargo builds `tests/*.rs` only).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dedup_core::layers::RetryPolicy;
use dedup_core::layers::metric_names as m;
use dedup_core::{
    DedupStore, FailurePolicy, Handled, InboxConfig, InboxError, Key, Lease, RecordState,
};
use futures::future::BoxFuture;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

use super::sqlx::{self, AssertSqlSafe};
use super::{Conn, Db, ID_PARAM, STOCK_TABLE_OPTIONS, TxInbox, before_locking, common, stock};

/// Create the stock table beside `store`'s inbox table, with its rows 1 and 2 (the rows
/// the handlers lock).
async fn create_stock(store: &common::Store) {
    let stock = stock(store);
    for sql in [
        format!(
            "CREATE TABLE {stock} (id BIGINT PRIMARY KEY, qty BIGINT NOT NULL){STOCK_TABLE_OPTIONS}"
        ),
        format!("INSERT INTO {stock} VALUES (1, 0), (2, 0)"),
    ] {
        sqlx::query(AssertSqlSafe(sql))
            .execute(store.pool())
            .await
            .expect("stock table");
    }
}

/// Lock and update stock row `id` on `conn`.
async fn bump(store: &common::Store, conn: &mut Conn, id: i64) -> Result<(), sqlx::Error> {
    let sql = format!(
        "UPDATE {} SET qty = qty + 1 WHERE id = {ID_PARAM}",
        stock(store)
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(id)
        .execute(conn)
        .await
        .map(drop)
}

/// Lock stock row `id` on `conn`, or fail at once if another transaction holds it
/// (`NOWAIT`).
async fn lock_nowait(store: &common::Store, conn: &mut Conn, id: i64) -> Result<(), sqlx::Error> {
    let sql = format!(
        "SELECT qty FROM {} WHERE id = {ID_PARAM} FOR UPDATE NOWAIT",
        stock(store)
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(id)
        .fetch_all(conn)
        .await
        .map(drop)
}

/// Workers handling deliveries at once.
const WORKERS: usize = 8;
/// Messages in the deadlock test.
const MESSAGES: usize = 32;

/// Run `scenario` on a current-thread runtime (its tasks share the thread) with a metrics
/// recorder of its own: its output, and the counters it recorded.
fn recorded<F: Future>(scenario: impl FnOnce() -> F) -> (F::Output, Counters) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let out = metrics::with_local_recorder(&recorder, || runtime.block_on(scenario()));
    let counters = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => Some((key.key().clone(), n)),
            _ => None,
        })
        .collect();
    (out, Counters(counters))
}

/// The counters a scenario recorded.
struct Counters(Vec<(metrics::Key, u64)>);

impl Counters {
    /// The sum of counter `name` over the series carrying every label of `labels`.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| {
                k.name() == name
                    && labels
                        .iter()
                        .all(|(l, v)| k.labels().any(|x| x.key() == *l && x.value() == *v))
            })
            .map(|(_, n)| n)
            .sum()
    }
}

/// A store on a fresh table with its business and stock tables, with a pool big enough
/// for every worker's transaction and the inbox's own statements beside them.
async fn store(url: &str, test: &str) -> common::Store {
    let mut config = common::config(&common::unique_table(test));
    config.max_connections = 2 * WORKERS as u32 + 2;
    let store = common::Store::connect_with(url, config)
        .await
        .expect("connect and migrate");
    common::create_business_table(&store).await;
    create_stock(&store).await;
    store
}

/// A pool of the test's own on the store's database: the user's pool.
async fn own_pool(url: &str) -> sqlx::Pool<Db> {
    sqlx::pool::PoolOptions::<Db>::new()
        .max_connections(WORKERS as u32 + 2)
        .connect(url)
        .await
        .expect("the user's own pool")
}

/// `f` as a `TxInbox` handler (a closure bound to a name needs its signature given).
fn handler<F>(f: F) -> F
where
    F: for<'c> FnMut(
        &'c mut Conn,
        &'c Lease,
    ) -> BoxFuture<'c, Result<Option<Vec<u8>>, sqlx::Error>>,
{
    f
}

fn key(consumer: &str, id: usize) -> Key {
    Key::new(consumer, format!("order-{id}")).expect("key")
}

/// Fast retries for the tests: `retries` runs again, 5 ms doubling to 100 ms (jittered).
fn retries(retries: u32) -> RetryPolicy {
    RetryPolicy {
        max_retries: retries,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(100),
    }
}

/// A deadlock test's handler for message `id`: its writes end with the business row
/// `reserved`.
pub type Work = for<'c> fn(
    &'c common::Store,
    &'c mut Conn,
    &'c Key,
    usize,
) -> BoxFuture<'c, Result<Option<Vec<u8>>, sqlx::Error>>;

/// [`reserve`] as a [`Work`]: even messages lock row 1 first, odd ones row 2.
fn opposite_orders<'c>(
    store: &'c common::Store,
    conn: &'c mut Conn,
    key: &'c Key,
    id: usize,
) -> BoxFuture<'c, Result<Option<Vec<u8>>, sqlx::Error>> {
    Box::pin(reserve(store, conn, key, id.is_multiple_of(2)))
}

/// The handler of the deadlock test: lock the two stock rows in an order that depends on
/// the message (half one way, half the other, so concurrent runs deadlock), then write
/// the business row.
async fn reserve(
    store: &common::Store,
    conn: &mut Conn,
    key: &Key,
    first_a: bool,
) -> Result<Option<Vec<u8>>, sqlx::Error> {
    before_locking(conn).await?;
    let (first, second) = if first_a { (1_i64, 2_i64) } else { (2, 1) };
    bump(store, conn, first).await?;
    // Widen the window in which the other order takes its first row.
    tokio::time::sleep(Duration::from_millis(5)).await;
    bump(store, conn, second).await?;
    common::insert_business_row(store, conn, key, "reserved").await;
    Ok(None)
}

/// What the workers of the deadlock test saw.
#[derive(Default)]
struct Seen {
    /// Runs of the handler.
    runs: AtomicU32,
    /// Deliveries (calls of `handle`).
    deliveries: AtomicU32,
    /// Deliveries answered `InboxError::Conflict` (then delivered again).
    conflicts: AtomicU32,
    /// Dead letters.
    dead_letters: AtomicU32,
    /// The attempt each message was processed as.
    processed: Mutex<HashMap<usize, u32>>,
    /// Other answers, for the failure message.
    other: Mutex<Vec<String>>,
}

/// `WORKERS` workers take `MESSAGES` deadlocking messages from one queue, as a broker's
/// consumer would, each through `inbox.handle` with `max_attempts = 3`; an error
/// redelivers the message. Every message must be processed once, none dead-lettered, and
/// every conflict's run again counted (`reason = "conflict"`) without using an attempt.
/// `own` runs it through `with_begin` on a pool of the test's own (the user's
/// transactions); `work` is the handler.
pub fn deadlocking_workers_process_each_message_once(test: &str, own: bool, work: Work) {
    let Some(url) = common::url() else { return };
    let consumer = "shipments";
    let (seen, counters) = recorded(|| async {
        let store = store(&url, test).await;
        let mut inbox = TxInbox::new(store.clone())
            .with_config(InboxConfig {
                max_attempts: Some(3),
                ..InboxConfig::default()
            })
            .with_retry(retries(10))
            .observed();
        if own {
            inbox = inbox.with_begin(own_pool(&url).await);
        }
        let queue: Arc<Mutex<VecDeque<usize>>> = Arc::new(Mutex::new((0..MESSAGES).collect()));
        let unsettled = Arc::new(AtomicU32::new(MESSAGES as u32));
        let seen = Arc::new(Seen::default());
        let started = Instant::now();
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (inbox, store, queue, unsettled, seen) = (
                    inbox.clone(),
                    store.clone(),
                    Arc::clone(&queue),
                    Arc::clone(&unsettled),
                    Arc::clone(&seen),
                );
                tokio::spawn(async move {
                    while unsettled.load(Ordering::SeqCst) > 0 {
                        assert!(started.elapsed() < Duration::from_secs(60), "stuck");
                        let Some(id) = queue.lock().unwrap().pop_front() else {
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            continue;
                        };
                        let k = key(consumer, id);
                        seen.deliveries.fetch_add(1, Ordering::SeqCst);
                        let handled = inbox
                            .handle(&k, None, |conn, _lease| {
                                seen.runs.fetch_add(1, Ordering::SeqCst);
                                let (store, k) = (store.clone(), k.clone());
                                Box::pin(async move { work(&store, conn, &k, id).await })
                            })
                            .await;
                        match handled {
                            Ok(Handled::Processed { lease, .. }) => {
                                seen.processed.lock().unwrap().insert(id, lease.attempt);
                                unsettled.fetch_sub(1, Ordering::SeqCst);
                                continue;
                            }
                            Ok(Handled::DeadLetter { .. }) => {
                                seen.dead_letters.fetch_add(1, Ordering::SeqCst);
                                unsettled.fetch_sub(1, Ordering::SeqCst);
                                continue;
                            }
                            Err(InboxError::Conflict { .. }) => {
                                seen.conflicts.fetch_add(1, Ordering::SeqCst);
                            }
                            other => seen.other.lock().unwrap().push(format!("{id}: {other:?}")),
                        }
                        // Redelivered, as a broker would after a nack.
                        queue.lock().unwrap().push_back(id);
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.await.expect("worker");
        }
        for id in 0..MESSAGES {
            let k = key(consumer, id);
            assert_eq!(
                common::business_rows(&store, &k).await,
                ["reserved"],
                "{k} processed once"
            );
            let record = store.get(&k).await.expect("get").expect("a record");
            assert!(
                matches!(record.state, RecordState::Completed { .. }),
                "{record:?}"
            );
        }
        println!(
            "{test}: {MESSAGES} messages, {} runs, {} deliveries, in {:?}",
            seen.runs.load(Ordering::SeqCst),
            seen.deliveries.load(Ordering::SeqCst),
            started.elapsed()
        );
        Arc::try_unwrap(seen).ok().expect("the workers are done")
    });
    let other = seen.other.lock().unwrap().clone();
    assert!(other.is_empty(), "unexpected answers: {other:?}");
    assert_eq!(
        seen.dead_letters.load(Ordering::SeqCst),
        0,
        "no dead letter"
    );
    let processed = seen.processed.lock().unwrap().clone();
    assert_eq!(processed.len(), MESSAGES, "every message processed");
    let (runs, deliveries, given_back) = (
        u64::from(seen.runs.load(Ordering::SeqCst)),
        u64::from(seen.deliveries.load(Ordering::SeqCst)),
        u64::from(seen.conflicts.load(Ordering::SeqCst)),
    );
    let tx = ("mode", "tx");
    let conflict_runs = counters.get(
        m::HANDLER_RETRIES_TOTAL,
        &[tx, ("consumer", consumer), ("reason", "conflict")],
    );
    println!("{test}: {conflict_runs} conflicts run again, {given_back} given back");
    assert!(
        conflict_runs > 0,
        "the workload deadlocked (else it proves nothing)"
    );
    assert_eq!(
        runs,
        deliveries + conflict_runs,
        "every run beyond a delivery's first is a conflict's run again, and counted"
    );
    // Attempts are used by deliveries only: the first, and one per conflict given back.
    let attempts_beyond_the_first: u64 = processed.values().map(|a| u64::from(a - 1)).sum();
    assert_eq!(
        attempts_beyond_the_first, given_back,
        "a conflict's runs again use no attempt: {processed:?}"
    );
    assert_eq!(
        counters.get(m::HANDLER_FAILURES_TOTAL, &[tx, ("kind", "conflict")]),
        given_back
    );
    assert_eq!(
        counters.get(m::HANDLER_FAILURES_TOTAL, &[tx, ("kind", "handler")]),
        0,
        "a deadlock is never the handler's failure"
    );
    assert_eq!(
        counters.get(m::HANDLER_RETRIES_TOTAL, &[tx, ("reason", "database")]),
        0
    );
    assert_eq!(counters.get(m::DEAD_LETTERS_TOTAL, &[tx]), 0);
}

#[test]
fn deadlocking_workers_process_each_message_once_without_dead_letters() {
    deadlocking_workers_process_each_message_once("deadlocks", false, opposite_orders);
}

#[test]
fn deadlocking_workers_in_their_own_transactions_process_each_message_once() {
    deadlocking_workers_process_each_message_once("deadlocks_own", true, opposite_orders);
}

/// A conflict on every run (a row locked by another transaction, taken with `NOWAIT`):
/// the retries run out, one attempt is used, the failure is kept as kind `conflict` (not
/// stored as the key's result under `FailurePolicy::Store`), and counted; once the lock
/// is gone, the next delivery is attempt 2.
#[test]
fn a_conflict_that_outlasts_the_retries_uses_one_attempt_and_is_kept_as_conflict() {
    let Some(url) = common::url() else { return };
    let ((), counters) = recorded(|| async {
        let store = store(&url, "conflict_runs_out").await;
        let inbox = TxInbox::new(store.clone())
            .with_config(InboxConfig {
                max_attempts: Some(3),
                failures: FailurePolicy::Store,
                ..InboxConfig::default()
            })
            .with_retry(retries(3))
            .observed();
        let mut holder = store.pool().begin().await.expect("begin");
        bump(&store, &mut holder, 1)
            .await
            .expect("the other transaction's lock");
        let k = key("shipments", 1);
        let runs = AtomicU32::new(0);
        let handler = handler(|conn, _lease| {
            runs.fetch_add(1, Ordering::SeqCst);
            let (store, k) = (store.clone(), k.clone());
            Box::pin(async move {
                common::insert_business_row(&store, conn, &k, "reserved").await;
                lock_nowait(&store, conn, 1).await?;
                Ok(None)
            })
        });
        let refused = inbox.handle(&k, None, handler).await;
        match &refused {
            Err(InboxError::Conflict { failure, .. }) => {
                assert_eq!((failure.kind.as_str(), failure.attempt), ("conflict", 1));
            }
            other => panic!("expected InboxError::Conflict, got {other:?}"),
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            4,
            "the first run and 3 retries"
        );
        assert!(common::business_rows(&store, &k).await.is_empty());
        let record = store.get(&k).await.expect("get").expect("a record");
        assert_eq!(record.attempt, 1, "one attempt for four runs: {record:?}");
        let kept = record.last_failure.clone().expect("the failure kept");
        assert_eq!((kept.kind.as_str(), kept.attempt), ("conflict", 1));
        assert!(
            !matches!(record.state, RecordState::Completed { .. }),
            "released, not stored as the result: {record:?}"
        );

        holder.rollback().await.expect("rollback");
        let handled = inbox.handle(&k, None, handler).await.expect("redelivery");
        assert!(
            matches!(&handled, Handled::Processed { lease, .. } if lease.attempt == 2),
            "{handled:?}"
        );
        assert_eq!(common::business_rows(&store, &k).await, ["reserved"]);
    });
    let tx = ("mode", "tx");
    assert_eq!(
        counters.get(m::HANDLER_RETRIES_TOTAL, &[tx, ("reason", "conflict")]),
        3
    );
    assert_eq!(
        counters.get(m::HANDLER_FAILURES_TOTAL, &[tx, ("kind", "conflict")]),
        1
    );
    assert_eq!(
        counters.get(m::HANDLER_FAILURES_TOTAL, &[tx, ("kind", "handler")]),
        0
    );
    assert_eq!(counters.get(m::STORED_FAILURES_TOTAL, &[tx]), 0);
}

/// `with_begin` with a closure that begins on the user's pool and writes a row of its
/// own first: a successful run commits that row, the handler's and the completion
/// together; a failing handler (stored as the key's result) rolls the whole transaction
/// back; a conflict raised by the closure itself is run again under the same lease.
#[tokio::test]
async fn with_begin_commits_a_successful_run_only_and_retries_a_conflict_at_begin() {
    let Some(url) = common::url() else { return };
    let store = store(&url, "with_begin").await;
    let pool = own_pool(&url).await;
    let (begins, begun) = (Arc::new(AtomicU32::new(0)), key("audit", 0));
    // Another transaction's lock, which the closure's first begin meets (then lifts).
    let holder: Arc<tokio::sync::Mutex<Option<sqlx::Transaction<'static, Db>>>> = Arc::default();
    let begin = {
        let (pool, store, begins, begun, holder) = (
            pool.clone(),
            store.clone(),
            Arc::clone(&begins),
            begun.clone(),
            Arc::clone(&holder),
        );
        move || {
            let (pool, store, begins, begun, holder) = (
                pool.clone(),
                store.clone(),
                Arc::clone(&begins),
                begun.clone(),
                Arc::clone(&holder),
            );
            async move {
                begins.fetch_add(1, Ordering::SeqCst);
                let mut tx = pool.begin().await?;
                if let Some(other) = holder.lock().await.take() {
                    let refused = lock_nowait(&store, &mut tx, 1).await;
                    other.rollback().await?;
                    refused?;
                }
                common::insert_business_row(&store, &mut tx, &begun, "begun").await;
                Ok(tx)
            }
        }
    };
    let inbox = TxInbox::new(store.clone())
        .with_config(InboxConfig {
            failures: FailurePolicy::Store,
            ..InboxConfig::default()
        })
        .with_retry(retries(3))
        .with_begin(begin);

    // A successful run: everything in the user's transaction commits.
    let ok = key("shipments", 1);
    let handled = inbox
        .handle(&ok, None, |conn, _lease| {
            let (store, ok) = (store.clone(), ok.clone());
            Box::pin(async move {
                common::insert_business_row(&store, conn, &ok, "reserved").await;
                Ok::<_, sqlx::Error>(Some(b"shipped".to_vec()))
            })
        })
        .await
        .expect("processed");
    assert!(matches!(handled, Handled::Processed { .. }), "{handled:?}");
    assert_eq!(common::business_rows(&store, &ok).await, ["reserved"]);
    assert_eq!(common::business_rows(&store, &begun).await, ["begun"]);

    // A failing handler: the failure is stored, the user's transaction rolled back whole
    // (the closure's row too).
    let bad = key("shipments", 2);
    let failed = inbox
        .handle(&bad, None, |conn, _lease| {
            let (store, bad) = (store.clone(), bad.clone());
            Box::pin(async move {
                common::insert_business_row(&store, conn, &bad, "half-done").await;
                Err::<Option<Vec<u8>>, _>("address unknown")
            })
        })
        .await
        .expect("a stored failure");
    assert!(
        matches!(&failed, Handled::Failed { error, replay: false } if error.contains("address unknown")),
        "{failed:?}"
    );
    assert!(common::business_rows(&store, &bad).await.is_empty());
    assert_eq!(
        common::business_rows(&store, &begun).await,
        ["begun"],
        "the failed run's transaction rolled back whole"
    );

    // A conflict at begin: run again under the same lease.
    let mut other = store.pool().begin().await.expect("begin");
    bump(&store, &mut other, 1)
        .await
        .expect("the other transaction's lock");
    *holder.lock().await = Some(other);
    let before = begins.load(Ordering::SeqCst);
    let late = key("shipments", 3);
    let handled = inbox
        .handle(&late, None, |conn, _lease| {
            let (store, late) = (store.clone(), late.clone());
            Box::pin(async move {
                common::insert_business_row(&store, conn, &late, "reserved").await;
                Ok::<_, sqlx::Error>(None)
            })
        })
        .await
        .expect("processed after the conflict");
    assert!(
        matches!(&handled, Handled::Processed { lease, .. } if lease.attempt == 1),
        "a conflict at begin uses no attempt: {handled:?}"
    );
    assert_eq!(
        begins.load(Ordering::SeqCst) - before,
        2,
        "refused, then begun"
    );
    assert_eq!(common::business_rows(&store, &late).await, ["reserved"]);
    assert_eq!(
        common::business_rows(&store, &begun).await,
        ["begun", "begun"]
    );
}
