//! The background [`Purger`] on a real store: old records go, live leases and young
//! records stay, and two purgers running at once (as on two nodes, each with its own
//! store handle) remove each eligible record once between them.

use std::time::Duration;

use dedup_core::{ClaimOptions, Purger, PurgerStats, RecordState};

use crate::StoreFactory;
use crate::support::{acquire_with, complete, handles, key, record, setup};

/// Two purgers over two handles of one store remove every record past retention exactly
/// once (their counts add up to the eligible records), and leave live leases and records
/// younger than the retention alone.
pub async fn purgers_remove_old_records_once_and_keep_live_leases<F: StoreFactory>(factory: &F) {
    const HOUR: Duration = Duration::from_secs(3600);
    let (ctx, store) = setup(
        factory,
        "purgers_remove_old_records_once_and_keep_live_leases",
    )
    .await;
    let mut old = Vec::new();
    for i in 0..30 {
        let k = key(&format!("old-c{i}"));
        complete(&store, &k, Some(b"done")).await;
        old.push(k);
    }
    for i in 0..10 {
        let k = key(&format!("old-e{i}"));
        acquire_with(&store, &k, &ClaimOptions::lease(Duration::from_secs(1))).await;
        old.push(k);
    }
    let live = acquire_with(&store, &key("live"), &ClaimOptions::lease(3 * HOUR)).await;
    ctx.clock.advance(2 * HOUR);
    let young = key("young");
    complete(&store, &young, None).await;

    let nodes = handles(factory, &ctx, 2).await;
    let start = |i: usize| {
        Purger::new(HOUR, Duration::from_millis(20))
            .longest_lease(HOUR)
            .start(nodes[i].clone())
            .expect("a retention as long as the longest lease is accepted")
    };
    let purgers = [start(0), start(1)];
    let eligible = old.len() as u64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while purgers.iter().map(|p| p.removed()).sum::<u64>() < eligible {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the purgers removed {} of {eligible} old records in 20 s",
            purgers.iter().map(|p| p.removed()).sum::<u64>()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Let both run a few more times: nothing may be counted twice.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let [a, b] = purgers;
    let (a, b): (PurgerStats, PurgerStats) = (a.stop().await, b.stop().await);
    assert_eq!(
        a.removed + b.removed,
        eligible,
        "each old record removed once across both purgers: {a:?} {b:?}"
    );
    assert!(a.runs + b.runs >= 4, "both kept running: {a:?} {b:?}");
    assert_eq!((a.failures, b.failures), (0, 0));
    for k in &old {
        assert_eq!(record(&store, k).await, None, "{k} must have been purged");
    }
    let rec = record(&store, &live.key)
        .await
        .expect("the live lease stays");
    assert!(
        matches!(rec.state, RecordState::InFlight { token, .. } if token == live.token),
        "the live lease stays untouched: {rec:?}"
    );
    let rec = record(&store, &young)
        .await
        .expect("the young record stays");
    assert!(
        matches!(rec.state, RecordState::Completed { .. }),
        "{rec:?}"
    );
}
