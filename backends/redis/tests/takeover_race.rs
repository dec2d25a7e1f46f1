//! The orphan-takeover race: many workers on several connections claim one expired key at
//! the same instant. Exactly one takes it over; the stale owner can then neither commit,
//! renew nor release, and its attempts change nothing. Run against standalone Redis and
//! Redis Cluster.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Target, config};
use dedup_core::{
    Claim, ClaimOptions, CommitRequest, DedupStore, Error, Key, Lease, ManualClock, RecordState,
};
use dedup_redis::RedisStore;
use tokio::sync::Barrier;

const WORKERS: usize = 32;
const CONNECTIONS: usize = 4;
const ROUNDS: usize = 10;
const LEASE: Duration = Duration::from_secs(10);

async fn stores(target: &Target, test: &str, clock: &Arc<ManualClock>) -> Vec<RedisStore> {
    let config = config(test, clock);
    let mut out = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        out.push(target.open(config.clone()).await);
    }
    out
}

/// `WORKERS` tasks over `stores` claim `key` at once (released together by a barrier).
async fn claim_all_at_once(stores: &[RedisStore], key: &Key) -> Vec<Claim> {
    let barrier = Arc::new(Barrier::new(WORKERS));
    let tasks: Vec<_> = (0..WORKERS)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            let barrier = barrier.clone();
            let key = key.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                store.claim(&key, &ClaimOptions::lease(LEASE)).await
            })
        })
        .collect();
    let mut claims = Vec::with_capacity(WORKERS);
    for t in tasks {
        claims.push(t.await.expect("task").expect("a claim must not fail"));
    }
    claims
}

fn lease_lost<T: std::fmt::Debug>(result: Result<T, Error>, what: &str) {
    match result {
        Err(Error::LeaseLost { .. }) => {}
        other => panic!("{what}: expected LeaseLost, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_workers_take_over_an_expired_key_exactly_once() {
    for target in Target::all("many_workers_take_over_an_expired_key_exactly_once") {
        let clock = Arc::new(ManualClock::starting_now());
        let stores = stores(&target, "race", &clock).await;
        for round in 0..ROUNDS {
            let key = Key::new("race", format!("m{round}")).unwrap();
            let stale: Lease = stores[0]
                .claim(&key, &ClaimOptions::lease(LEASE))
                .await
                .unwrap()
                .into_lease()
                .expect("first claim acquires");
            // The lease expires exactly now (now >= expires_at): the key is up for takeover.
            clock.advance(LEASE);

            let claims = claim_all_at_once(&stores, &key).await;
            let winners: Vec<&Lease> = claims.iter().filter_map(Claim::lease).collect();
            assert_eq!(
                winners.len(),
                1,
                "{}: round {round}: exactly one takeover, got {claims:?}",
                target.name()
            );
            let winner = winners[0].clone();
            assert_eq!(
                (winner.fence, winner.attempt),
                (2, 2),
                "takeover: fence+1, attempt+1"
            );
            assert_ne!(winner.token, stale.token);
            for c in &claims {
                if !c.is_acquired() {
                    assert_eq!(
                        *c,
                        Claim::InFlight {
                            expires_at: winner.expires_at,
                            attempt: 2
                        },
                        "{}: the losers see the winner's live lease",
                        target.name()
                    );
                }
            }

            // The stale owner comes back: every fenced operation is rejected.
            let before = stores[1].get(&key).await.unwrap();
            lease_lost(
                stores[2].commit(&stale, Some(b"stale")).await,
                "stale commit",
            );
            lease_lost(stores[3].release(&stale).await, "stale release");
            lease_lost(stores[0].renew(&stale, LEASE).await, "stale renew");
            let batch = stores[1]
                .commit_many(&[CommitRequest {
                    lease: stale.clone(),
                    outcome: None,
                }])
                .await
                .expect("commit_many");
            assert_eq!(batch.len(), 1);
            lease_lost(batch.into_iter().next().unwrap(), "stale commit_many item");
            assert_eq!(
                stores[0].get(&key).await.unwrap(),
                before,
                "{}: the stale owner's attempts changed the record",
                target.name()
            );
            match before.map(|r| r.state) {
                Some(RecordState::InFlight { token, .. }) => assert_eq!(token, winner.token),
                other => panic!("the winner's lease must be stored, got {other:?}"),
            }

            // The winner is unaffected and commits.
            stores[3].commit(&winner, Some(b"done")).await.unwrap();
            match stores[2].get(&key).await.unwrap().map(|r| r.state) {
                Some(RecordState::Completed { token, outcome, .. }) => {
                    assert_eq!(token, Some(winner.token));
                    assert_eq!(outcome.as_deref(), Some(&b"done"[..]));
                }
                other => panic!("expected the winner's completion, got {other:?}"),
            }
            // And after the commit the stale owner still cannot touch it.
            lease_lost(
                stores[2].commit(&stale, None).await,
                "stale commit after completion",
            );
            lease_lost(
                stores[2].release(&stale).await,
                "stale release after completion",
            );
        }
    }
}

/// The stale owner commits while the others race to take over: either its commit lands
/// first (it succeeds, nobody acquires, everyone sees Completed) or a takeover does (its
/// commit is LeaseLost, exactly one acquires). Never both, never neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_commit_racing_the_takeovers_has_one_winner() {
    for target in Target::all("a_stale_commit_racing_the_takeovers_has_one_winner") {
        let clock = Arc::new(ManualClock::starting_now());
        let stores = stores(&target, "race_commit", &clock).await;
        let (mut commits_won, mut takeovers_won) = (0, 0);
        for round in 0..ROUNDS * 2 {
            let key = Key::new("race", format!("c{round}")).unwrap();
            let stale = stores[0]
                .claim(&key, &ClaimOptions::lease(LEASE))
                .await
                .unwrap()
                .into_lease()
                .expect("first claim acquires");
            clock.advance(LEASE);
            let committer = {
                let store = stores[1].clone();
                let stale = stale.clone();
                tokio::spawn(async move { store.commit(&stale, Some(b"late")).await })
            };
            let claims = claim_all_at_once(&stores, &key).await;
            let commit = committer.await.expect("task");
            let acquired = claims.iter().filter(|c| c.is_acquired()).count();
            match commit {
                Ok(()) => {
                    commits_won += 1;
                    assert_eq!(acquired, 0, "{}: commit won, yet {claims:?}", target.name());
                }
                Err(Error::LeaseLost { .. }) => {
                    takeovers_won += 1;
                    assert_eq!(acquired, 1, "{}: takeover won: {claims:?}", target.name());
                }
                Err(e) => panic!("commit failed: {e:?}"),
            }
            for c in &claims {
                if let Claim::Completed { outcome, .. } = c {
                    assert_eq!(outcome.as_deref(), Some(&b"late"[..]));
                }
            }
        }
        eprintln!(
            "{}: stale commit won {commits_won} rounds, takeover won {takeovers_won}",
            target.name()
        );
    }
}
