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
//! and operations run one at a time.

mod common;

use std::time::Duration;

use dedup_conformance::counting::{Cost, CostGuard, CountingProxy, Protocol};
use dedup_core::{
    BoxError, Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Key, Lease, Pace,
    PurgeOptions, TxClaim,
};
use dedup_mysql::{MySqlConfig, MySqlStore, TxInbox};

const BACKEND: &str = "mysql";

/// The expected cost of each operation measured below.
const CLAIM_FRESH: Cost = Cost::new(1, 1, 1);
const CLAIM_IN_FLIGHT: Cost = Cost::new(4, 4, 2);
const CLAIM_COMPLETED: Cost = Cost::new(4, 4, 2);
const RENEW: Cost = Cost::new(1, 1, 1);
const COMMIT: Cost = Cost::new(1, 1, 1);
const RELEASE: Cost = Cost::new(1, 1, 1);
const CLAIM_MANY_100: Cost = Cost::new(1, 1, 1);
const COMMIT_MANY_100: Cost = Cost::new(1, 1, 1);
const PURGE_ONE_BATCH: Cost = Cost::new(1, 1, 1);
const CLAIM_IN_TX: Cost = Cost::new(1, 1, 0);
const TX_INBOX_HANDLE: Cost = Cost::new(4, 4, 2);

fn key(id: &str) -> Key {
    Key::new("op-counts", id).unwrap()
}

fn acquired(claim: Claim) -> Lease {
    match claim {
        Claim::Acquired(lease) => lease,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

fn hundred(prefix: &str, options: &ClaimOptions) -> Vec<ClaimRequest> {
    (0..100)
        .map(|i| ClaimRequest::new(key(&format!("{prefix}{i}")), options.clone()))
        .collect()
}

fn commits(claims: Vec<dedup_core::ItemResult<Claim>>) -> Vec<CommitRequest> {
    claims
        .into_iter()
        .map(|c| CommitRequest {
            lease: acquired(c.expect("claimed")),
            outcome: Some(b"done".to_vec()),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operation_costs_what_it_did() {
    let url = url_or_skip!();
    let (proxy, through) = CountingProxy::for_url(&url, Protocol::MySql)
        .await
        .expect("start the counting proxy");
    let store = MySqlStore::connect_with(
        &through,
        MySqlConfig {
            table: common::unique_table("op_counts"),
            max_connections: 1,
            ..MySqlConfig::default()
        },
    )
    .await
    .expect("connect and migrate");
    let pool = store.pool().clone();
    let mut g = CostGuard::new(BACKEND, proxy, move || {
        pool.num_idle() == usize::try_from(pool.size()).unwrap()
    });
    let options = ClaimOptions::lease(Duration::from_secs(30));

    // Lease mode, one key at a time: warm up on "w*", measure on "a" / "b".
    let warm = acquired(store.claim(&key("w1"), &options).await.unwrap());
    let lease = acquired(
        g.check(
            "claim of a fresh key",
            CLAIM_FRESH,
            store.claim(&key("a"), &options),
        )
        .await
        .unwrap(),
    );
    store.claim(&key("w1"), &options).await.unwrap();
    let claim = g
        .check(
            "claim of a key in flight",
            CLAIM_IN_FLIGHT,
            store.claim(&key("a"), &options),
        )
        .await
        .unwrap();
    assert!(matches!(claim, Claim::InFlight { .. }), "{claim:?}");
    let warm = store.renew(&warm, Duration::from_secs(60)).await.unwrap();
    let lease = g
        .check("renew", RENEW, store.renew(&lease, Duration::from_secs(60)))
        .await
        .unwrap();
    store.commit(&warm, Some(b"done")).await.unwrap();
    g.check("commit", COMMIT, store.commit(&lease, Some(b"done")))
        .await
        .unwrap();
    store.claim(&key("w1"), &options).await.unwrap();
    let claim = g
        .check(
            "claim of a completed key",
            CLAIM_COMPLETED,
            store.claim(&key("a"), &options),
        )
        .await
        .unwrap();
    assert!(matches!(claim, Claim::Completed { .. }), "{claim:?}");
    let warm = acquired(store.claim(&key("w2"), &options).await.unwrap());
    let lease = acquired(store.claim(&key("b"), &options).await.unwrap());
    store.release(&warm).await.unwrap();
    g.check("release", RELEASE, store.release(&lease))
        .await
        .unwrap();

    // Batches of 100.
    let warm = store.claim_many(&hundred("wm", &options)).await.unwrap();
    let requests = hundred("m", &options);
    let claimed = g
        .check(
            "claim_many of 100 keys",
            CLAIM_MANY_100,
            store.claim_many(&requests),
        )
        .await
        .unwrap();
    store.commit_many(&commits(warm)).await.unwrap();
    let requests = commits(claimed);
    for done in g
        .check(
            "commit_many of 100 keys",
            COMMIT_MANY_100,
            store.commit_many(&requests),
        )
        .await
        .unwrap()
    {
        done.expect("committed");
    }

    // One purge batch of 10 of the completed records.
    let purge = PurgeOptions::older_than(Duration::ZERO)
        .batch_size(10)
        .max_batches(1)
        .pace(Pace::Unpaced);
    store.purge(&purge).await.unwrap();
    let report = g
        .check("purge of one batch", PURGE_ONE_BATCH, store.purge(&purge))
        .await
        .unwrap();
    assert_eq!(report.completed + report.expired, 10, "{report:?}");

    // The transactional claim, inside the caller's transaction (its BEGIN and COMMIT are
    // the caller's, not counted).
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

    g.finish();
}
