//! Transactions through two nodes of the Galera cluster (`DEDUP_GALERA_URLS`). Row locks
//! are each node's own, so a second writer of a row does not wait: the later `COMMIT`
//! fails certification (1213), writes nothing, and is a conflict the transactional inbox
//! runs again. (Through one node the second waits, as on one server: `galera.rs` runs
//! those clauses on stores pinned to one node.)

#[path = "galera/mod.rs"]
mod common;
#[path = "common/mod.rs"]
mod mysql_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dedup_core::{DedupStore, Handled, InboxError, Key, RecordState, TxClaim};
use dedup_mysql::sqlx::{self, AssertSqlSafe};
use dedup_mysql::{MySqlStore, TxInbox};

/// Two stores on one table, through nodes 1 and 2.
async fn two_nodes(test: &str) -> (MySqlStore, MySqlStore) {
    let urls = common::urls();
    let table = common::unique_table(test);
    let first = common::node_store(&urls[0], &table, None).await;
    let second = common::node_store(&urls[1], &table, None).await;
    common::create_business_table(&first).await;
    (first, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_of_one_key_through_two_nodes_one_commits_and_the_other_conflicts() {
    if common::url().is_none() {
        return;
    }
    let (one, two) = two_nodes("galera_tx_claims").await;
    let key = Key::new("billing", "order-1").expect("key");
    let mut first = one.pool().begin().await.expect("begin on node 1");
    let mut second = two.pool().begin().await.expect("begin on node 2");
    let claimed = one
        .claim_in_tx(&mut first, &key, None)
        .await
        .expect("claim");
    assert_eq!(claimed, TxClaim::Claimed { fence: 1 });
    common::insert_business_row(&one, &mut first, &key, "first").await;
    // Node 2 does not see node 1's uncommitted claim, and nothing makes it wait.
    let also = two
        .claim_in_tx(&mut second, &key, None)
        .await
        .expect("claim");
    assert_eq!(also, TxClaim::Claimed { fence: 1 });
    common::insert_business_row(&two, &mut second, &key, "second").await;
    first.commit().await.expect("the first commit wins");
    let refused = second
        .commit()
        .await
        .expect_err("the second fails certification");
    assert_eq!(error_number(&refused), Some(1213), "{refused}");
    assert_eq!(common::business_rows(&two, &key).await, vec!["first"]);
    let record = two.get(&key).await.expect("get").expect("a record");
    assert!(
        matches!(record.state, RecordState::Completed { .. }),
        "{record:?}"
    );
    assert_eq!(record.fence, 1);
}

fn error_number(error: &sqlx::Error) -> Option<u16> {
    match error {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(sqlx::mysql::MySqlDatabaseError::number),
        _ => None,
    }
}

/// Handlers on two nodes add to one stock row at once: a conflict at `COMMIT` is run again
/// under the same lease (and past the inbox's retries, redelivered), so the row counts
/// each message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tx_inbox_handlers_through_two_nodes_run_a_certification_conflict_again() {
    if common::url().is_none() {
        return;
    }
    const PER_NODE: usize = 20;
    let (one, two) = two_nodes("galera_tx_stock").await;
    let stock = format!("`{}_stock`", one.config().table);
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {stock} (id INT PRIMARY KEY, n INT NOT NULL) ENGINE = InnoDB; \
         INSERT INTO {stock} VALUES (1, 0)"
    )))
    .execute(one.pool())
    .await
    .expect("the stock table");
    let runs = Arc::new(AtomicUsize::new(0));
    let redelivered = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for (node, store) in [one.clone(), two.clone()].into_iter().enumerate() {
        let (runs, stock, redelivered) = (runs.clone(), stock.clone(), redelivered.clone());
        workers.push(tokio::spawn(async move {
            let inbox = TxInbox::new(store);
            for i in 0..PER_NODE {
                let key = Key::new("stock", format!("n{node}-{i}")).expect("key");
                // A conflict past the inbox's retries releases the key: the broker would
                // redeliver the message, and so does this loop.
                loop {
                    let (runs, stock) = (runs.clone(), stock.clone());
                    let handled = inbox
                        .handle(&key, None, move |conn, _lease| {
                            let (runs, stock) = (runs.clone(), stock.clone());
                            Box::pin(async move {
                                runs.fetch_add(1, Ordering::SeqCst);
                                let bump = format!("UPDATE {stock} SET n = n + 1 WHERE id = 1");
                                sqlx::query(AssertSqlSafe(bump)).execute(&mut *conn).await?;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                Ok::<_, sqlx::Error>(None)
                            })
                        })
                        .await;
                    match handled {
                        Ok(Handled::Processed { .. }) => break,
                        Err(InboxError::Conflict { .. }) => {
                            redelivered.fetch_add(1, Ordering::SeqCst);
                        }
                        other => panic!("{other:?}"),
                    }
                }
            }
        }));
    }
    for worker in workers {
        worker.await.expect("a worker");
    }
    let n: i32 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT n FROM {stock} WHERE id = 1")))
        .fetch_one(two.pool())
        .await
        .expect("the stock");
    let runs = runs.load(Ordering::SeqCst);
    let redelivered = redelivered.load(Ordering::SeqCst);
    eprintln!(
        "{} messages, {runs} handler runs, {redelivered} redelivered after a conflict",
        2 * PER_NODE
    );
    assert_eq!(n, 2 * PER_NODE as i32, "each message counted once");
    assert!(
        runs > 2 * PER_NODE,
        "no certification conflict happened ({runs} runs)"
    );
}

/// Stores opened at once through the three nodes, each migrating a table of its own: the
/// named lock is one node's own, so their migrations can fail certification against each
/// other, and run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrations_through_three_nodes_at_once_all_succeed() {
    if common::url().is_none() {
        return;
    }
    let urls = common::urls();
    let opening = (0..9).map(|i| {
        let url = urls[i % urls.len()].clone();
        tokio::spawn(async move {
            let table = common::unique_table("galera_migrate");
            MySqlStore::connect_with(&url, common::config(&table)).await
        })
    });
    for opened in futures::future::join_all(opening).await {
        opened.expect("a task").expect("connect and migrate");
    }
}
