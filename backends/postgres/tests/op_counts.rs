//! A regression guard on what each operation costs on the wire: exact round trips,
//! statements and prepares per operation, counted by a
//! [`CountingProxy`](dedup_conformance::counting::CountingProxy) between one store and the
//! server (see BENCHMARKS.md, "Wire cost guard"). A change that adds a round trip or a
//! statement fails here with the operation's name; if the change is meant, update the
//! number here and the table in BENCHMARKS.md.
//!
//! Deterministic: only this store talks through the proxy; its pool has one connection (so
//! every call finds the same connection and its prepared statements); every operation runs
//! once on other keys before it is measured (the first use of a statement prepares it),
//! and operations run one at a time, so group commit never groups.

mod common;

use std::time::Duration;

use dedup_conformance::counting::{
    Cost, CostGuard, CountingProxy, LeaseCosts, Protocol, acquired, check_lease_mode,
    check_purge_batch, key,
};
use dedup_core::outbox::{OutboxMessage, OutboxStore};
use dedup_core::{BoxError, ClaimOptions, DedupStore, TxClaim};
use dedup_postgres::{PostgresConfig, PostgresStore, TxInbox};

const BACKEND: &str = "postgres";

/// The expected cost of each operation measured below.
const LEASE_MODE: LeaseCosts = LeaseCosts {
    claim_fresh: Cost::new(1, 1, 1),
    claim_in_flight: Cost::new(2, 2, 1),
    claim_completed: Cost::new(2, 2, 1),
    renew: Cost::new(1, 1, 1),
    commit: Cost::new(1, 1, 1),
    release: Cost::new(1, 1, 1),
    claim_many_100: Cost::new(1, 1, 1),
    commit_many_100: Cost::new(1, 1, 1),
};
const PURGE_ONE_BATCH: Cost = Cost::new(1, 1, 1);
const CLAIM_IN_TX: Cost = Cost::new(1, 1, 0);
const COMMIT_IN_TX: Cost = Cost::new(1, 1, 0);
const TX_INBOX_HANDLE: Cost = Cost::new(4, 4, 2);
const OUTBOX_ENQUEUE: Cost = Cost::new(1, 1, 0);
const RELAY_TAKE: Cost = Cost::new(1, 1, 1);
const RELAY_MARK_SENT: Cost = Cost::new(1, 1, 1);

fn message(id: &str) -> OutboxMessage {
    OutboxMessage::new("op-counts", id, b"payload".to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operation_costs_what_it_did() {
    let url = url_or_skip!();
    let (proxy, through) = CountingProxy::for_url(&url, Protocol::Postgres)
        .await
        .expect("start the counting proxy");
    let store = PostgresStore::connect_with(
        &through,
        PostgresConfig {
            schema: common::SCHEMA.into(),
            table: common::unique_table("op_counts"),
            max_connections: 1,
            ..PostgresConfig::default()
        },
    )
    .await
    .expect("connect and migrate");
    let pool = store.pool().clone();
    let mut g = CostGuard::new(BACKEND, proxy, move || {
        pool.num_idle() == usize::try_from(pool.size()).unwrap()
    });

    check_lease_mode(&mut g, &store, &LEASE_MODE).await;
    check_purge_batch(&mut g, &store, PURGE_ONE_BATCH).await;

    // The transactional claim and commit, inside the caller's transaction (its BEGIN and
    // COMMIT are the caller's, not counted).
    for (id, measured) in [("w3", false), ("c", true)] {
        let mut tx = store.pool().begin().await.unwrap();
        let claim = if measured {
            g.check_holding(
                "claim_in_tx",
                CLAIM_IN_TX,
                store.claim_in_tx(&mut tx, &key(id), None),
            )
            .await
        } else {
            store.claim_in_tx(&mut tx, &key(id), None).await
        };
        assert!(matches!(claim, Ok(TxClaim::Claimed { .. })), "{claim:?}");
        tx.commit().await.unwrap();
    }
    let options = ClaimOptions::lease(Duration::from_secs(30));
    for (id, measured) in [("w6", false), ("f", true)] {
        let lease = acquired(store.claim(&key(id), &options).await.unwrap());
        let mut tx = store.pool().begin().await.unwrap();
        let done = if measured {
            g.check_holding(
                "commit_in_tx",
                COMMIT_IN_TX,
                store.commit_in_tx(&mut tx, &lease, Some(b"done")),
            )
            .await
        } else {
            store.commit_in_tx(&mut tx, &lease, Some(b"done")).await
        };
        done.expect("commit_in_tx");
        tx.commit().await.unwrap();
    }

    // TxInbox::handle of one message whose handler runs nothing: the inbox's own cost,
    // its transaction's BEGIN and COMMIT included.
    let inbox = TxInbox::new(store.clone());
    for (id, measured) in [("w4", false), ("d", true)] {
        let k = key(id);
        let handle = inbox.handle(&k, None, |_conn, _lease| {
            Box::pin(async { Ok::<_, BoxError>(None) })
        });
        let handled = if measured {
            g.check("TxInbox::handle", TX_INBOX_HANDLE, handle).await
        } else {
            handle.await
        };
        assert!(handled.unwrap().is_settled());
    }

    // The outbox: enqueue of one message in the caller's transaction, then a relay's
    // take of a batch of 5 and its mark_sent.
    let outbox = store.outbox();
    for (id, measured) in [("w5", false), ("e", true)] {
        let mut tx = store.pool().begin().await.unwrap();
        let messages = [message(id)];
        let written = if measured {
            g.check_holding(
                "outbox enqueue",
                OUTBOX_ENQUEUE,
                outbox.enqueue(&mut tx, &messages),
            )
            .await
        } else {
            outbox.enqueue(&mut tx, &messages).await
        };
        assert_eq!(written.unwrap(), 1);
        tx.commit().await.unwrap();
    }
    let mut tx = store.pool().begin().await.unwrap();
    let batch: Vec<_> = (0..8).map(|i| message(&format!("batch{i}"))).collect();
    outbox.enqueue(&mut tx, &batch).await.unwrap();
    tx.commit().await.unwrap();
    let hold = Duration::from_secs(30);
    let warm = outbox.take(5, hold).await.unwrap();
    let ids: Vec<i64> = warm.rows.iter().map(|r| r.id).collect();
    outbox.mark_sent(&warm.token, &ids).await.unwrap();
    let held = g
        .check(
            "relay take of a batch of 5",
            RELAY_TAKE,
            outbox.take(5, hold),
        )
        .await
        .unwrap();
    assert_eq!(held.rows.len(), 5);
    let ids: Vec<i64> = held.rows.iter().map(|r| r.id).collect();
    g.check(
        "relay mark_sent of 5",
        RELAY_MARK_SENT,
        outbox.mark_sent(&held.token, &ids),
    )
    .await
    .unwrap();

    g.finish();
}
