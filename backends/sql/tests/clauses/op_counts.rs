//! The wire cost guard's scenario the same on every sqlx backend: the store behind a
//! [`CountingProxy`], the transactional claim and commit, `TxInbox::handle` and the
//! outbox's enqueue, take and mark_sent, each run once on other keys before it is
//! measured. Each backend's `tests/op_counts.rs` includes this file as a module (`#[path]`)
//! beside its `common` helpers, its `TxInbox` and the alias `Store`, and gives its expected
//! costs. Not a test target of its own (cargo builds `tests/*.rs` only).

use std::time::Duration;

use dedup_conformance::counting::{Cost, CostGuard, CountingProxy, Protocol, acquired, key};
use dedup_core::outbox::{OutboxMessage, OutboxStore};
use dedup_core::{BoxError, ClaimOptions, DedupStore, TxClaim};

use super::{Store, TxInbox, common};

/// The expected costs of the transactional operations.
pub struct TxCosts {
    /// `claim_in_tx` (inside the caller's transaction: its BEGIN and COMMIT not counted).
    pub claim_in_tx: Cost,
    /// `commit_in_tx` (likewise).
    pub commit_in_tx: Cost,
    /// `TxInbox::handle` of a handler that runs nothing, its transaction included.
    pub tx_inbox_handle: Cost,
}

/// The expected costs of the outbox's operations.
pub struct OutboxCosts {
    /// `enqueue` of one message in the caller's transaction.
    pub enqueue: Cost,
    /// A relay's take of a batch of 5.
    pub take: Cost,
    /// Its mark_sent of the 5.
    pub mark_sent: Cost,
}

/// A migrated store on a fresh table reached through a counting proxy, with a pool of one
/// connection (so every call finds the same connection and its prepared statements), and
/// the guard counting its traffic.
pub async fn guarded_store(
    url: &str,
    protocol: Protocol,
    backend: &'static str,
) -> (Store, CostGuard) {
    let (proxy, through) = CountingProxy::for_url(url, protocol)
        .await
        .expect("start the counting proxy");
    let mut config = common::config(&common::unique_table("op_counts"));
    config.max_connections = 1;
    let store = Store::connect_with(&through, config)
        .await
        .expect("connect and migrate");
    let pool = store.pool().clone();
    let guard = CostGuard::new(backend, proxy, move || {
        pool.num_idle() == usize::try_from(pool.size()).unwrap()
    });
    (store, guard)
}

/// The transactional claim and commit inside the caller's transaction, then
/// `TxInbox::handle` of one message whose handler runs nothing.
pub async fn check_transactional(g: &mut CostGuard, store: &Store, costs: &TxCosts) {
    for (id, measured) in [("w3", false), ("c", true)] {
        let mut tx = store.pool().begin().await.unwrap();
        let claim = if measured {
            g.check_holding(
                "claim_in_tx",
                costs.claim_in_tx,
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
                costs.commit_in_tx,
                store.commit_in_tx(&mut tx, &lease, Some(b"done")),
            )
            .await
        } else {
            store.commit_in_tx(&mut tx, &lease, Some(b"done")).await
        };
        done.expect("commit_in_tx");
        tx.commit().await.unwrap();
    }
    let inbox = TxInbox::new(store.clone());
    for (id, measured) in [("w4", false), ("d", true)] {
        let k = key(id);
        let handle = inbox.handle(&k, None, |_conn, _lease| {
            Box::pin(async { Ok::<_, BoxError>(None) })
        });
        let handled = if measured {
            g.check("TxInbox::handle", costs.tx_inbox_handle, handle)
                .await
        } else {
            handle.await
        };
        assert!(handled.unwrap().is_settled());
    }
}

fn message(id: &str) -> OutboxMessage {
    OutboxMessage::new("op-counts", id, b"payload".to_vec()).unwrap()
}

/// The outbox: enqueue of one message in the caller's transaction, then a relay's take of
/// a batch of 5 and its mark_sent.
pub async fn check_outbox(g: &mut CostGuard, store: &Store, costs: &OutboxCosts) {
    let outbox = store.outbox();
    for (id, measured) in [("w5", false), ("e", true)] {
        let mut tx = store.pool().begin().await.unwrap();
        let messages = [message(id)];
        let written = if measured {
            g.check_holding(
                "outbox enqueue",
                costs.enqueue,
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
            costs.take,
            outbox.take(5, hold),
        )
        .await
        .unwrap();
    assert_eq!(held.rows.len(), 5);
    let ids: Vec<i64> = held.rows.iter().map(|r| r.id).collect();
    g.check(
        "relay mark_sent of 5",
        costs.mark_sent,
        outbox.mark_sent(&held.token, &ids),
    )
    .await
    .unwrap();
}
