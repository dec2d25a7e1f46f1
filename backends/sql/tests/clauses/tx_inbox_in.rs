//! The `TxInbox::handle_in` clauses, the same on every sqlx backend: each backend's
//! `tests/tx_inbox_in.rs` includes this file as a module (`#[path]`) beside its own
//! `common` test helpers (`url`, `store`, `manual_clock`, the business table) and its
//! `TxInbox`. Not a test target of its own (cargo builds `tests/*.rs` only).

use std::time::Duration;

use dedup_core::{Handled, InboxConfig, Key};

use super::TxInbox;
use super::common;

fn key(id: &str) -> Key {
    Key::new("billing", id).expect("key")
}

#[tokio::test]
async fn a_joined_run_commits_with_the_callers_writes_and_a_duplicate_is_not_run() {
    let Some(url) = common::url() else { return };
    let store = common::store(&url, "joined_commit", None).await;
    common::create_business_table(&store).await;
    let inbox = TxInbox::new(store.clone());
    let k = key("order-1");

    let mut tx = store.pool().begin().await.expect("begin");
    common::insert_business_row(&store, &mut tx, &k, "caller-before").await;
    let handled = inbox
        .handle_in(&mut tx, &k, None, |conn, _lease| {
            let (store, k) = (store.clone(), k.clone());
            Box::pin(async move {
                common::insert_business_row(&store, conn, &k, "handled").await;
                Ok::<_, dedup_core::BoxError>(Some(b"invoiced".to_vec()))
            })
        })
        .await
        .expect("handle_in");
    assert!(matches!(handled, Handled::Processed { .. }), "{handled:?}");
    assert!(
        common::business_rows(&store, &k).await.is_empty(),
        "nothing is visible before the caller commits"
    );
    tx.commit().await.expect("commit");
    assert_eq!(
        common::business_rows(&store, &k).await,
        ["caller-before", "handled"]
    );

    let mut tx = store.pool().begin().await.expect("begin");
    let again = inbox
        .handle_in(&mut tx, &k, None, |_conn, _lease| {
            Box::pin(async move {
                panic!("a duplicate ran the handler");
                #[allow(unreachable_code)]
                Ok::<_, dedup_core::BoxError>(None)
            })
        })
        .await
        .expect("duplicate");
    assert!(
        matches!(&again, Handled::Duplicate { outcome: Some(o), .. } if o == b"invoiced"),
        "{again:?}"
    );
    tx.commit().await.expect("commit");
}

#[tokio::test]
async fn a_failed_joined_run_rolls_back_to_its_savepoint_and_leaves_the_callers_writes() {
    let Some(url) = common::url() else { return };
    let store = common::store(&url, "joined_failure", None).await;
    common::create_business_table(&store).await;
    let inbox = TxInbox::new(store.clone());
    let k = key("order-2");

    let mut tx = store.pool().begin().await.expect("begin");
    common::insert_business_row(&store, &mut tx, &k, "caller-before").await;
    let failed = inbox
        .handle_in(&mut tx, &k, None, |conn, _lease| {
            let (store, k) = (store.clone(), k.clone());
            Box::pin(async move {
                common::insert_business_row(&store, conn, &k, "half-done").await;
                Err::<Option<Vec<u8>>, _>("payment declined")
            })
        })
        .await;
    assert!(failed.is_err(), "{failed:?}");
    common::insert_business_row(&store, &mut tx, &k, "caller-after").await;
    tx.commit()
        .await
        .expect("the caller's transaction is still usable");
    assert_eq!(
        common::business_rows(&store, &k).await,
        ["caller-before", "caller-after"],
        "the failed run's write is undone, the caller's are kept"
    );
    // The key was released: the next delivery runs it, as attempt 2.
    let mut tx = store.pool().begin().await.expect("begin");
    let handled = inbox
        .handle_in(&mut tx, &k, None, |_conn, lease| {
            let attempt = lease.attempt;
            Box::pin(async move {
                assert_eq!(attempt, 2, "the failed run counted");
                Ok::<_, dedup_core::BoxError>(None)
            })
        })
        .await
        .expect("second delivery");
    assert!(matches!(handled, Handled::Processed { .. }), "{handled:?}");
    tx.commit().await.expect("commit");
}

#[tokio::test]
async fn a_caller_rollback_leaves_the_key_busy_until_its_lease_runs_out() {
    let Some(url) = common::url() else { return };
    let clock = common::manual_clock();
    let store = common::store(&url, "joined_rollback", Some(clock.clone())).await;
    common::create_business_table(&store).await;
    let lease = Duration::from_secs(30);
    let inbox = TxInbox::new(store.clone()).with_config(InboxConfig {
        lease,
        renew_every: None,
        ..InboxConfig::default()
    });
    let k = key("order-3");

    let mut tx = store.pool().begin().await.expect("begin");
    let handled = inbox
        .handle_in(&mut tx, &k, None, |conn, _lease| {
            let (store, k) = (store.clone(), k.clone());
            Box::pin(async move {
                common::insert_business_row(&store, conn, &k, "rolled-back").await;
                Ok::<_, dedup_core::BoxError>(None)
            })
        })
        .await
        .expect("handle_in");
    assert!(matches!(handled, Handled::Processed { .. }), "{handled:?}");
    tx.rollback().await.expect("rollback");
    assert!(common::business_rows(&store, &k).await.is_empty());

    let busy = inbox
        .handle(&k, None, |_conn, _lease| {
            Box::pin(async move { Ok::<_, dedup_core::BoxError>(None) })
        })
        .await
        .expect("busy");
    assert!(matches!(busy, Handled::Busy { .. }), "{busy:?}");

    clock.advance(lease + Duration::from_secs(1));
    let handled = inbox
        .handle(&k, None, |conn, lease| {
            let (store, k, attempt) = (store.clone(), k.clone(), lease.attempt);
            Box::pin(async move {
                assert_eq!(attempt, 2);
                common::insert_business_row(&store, conn, &k, "second").await;
                Ok::<_, dedup_core::BoxError>(None)
            })
        })
        .await
        .expect("after the lease ran out");
    assert!(matches!(handled, Handled::Processed { .. }), "{handled:?}");
    assert_eq!(common::business_rows(&store, &k).await, ["second"]);
}
