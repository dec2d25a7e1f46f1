//! Many tasks sending large batches at once: 16 tasks each claim and commit 1000 fresh keys
//! (one `claim_many`, one `commit_many` each). On a cluster this was one request per hash
//! slot (16 000 queued in the cluster client, every batch past its 5 s response timeout);
//! it is one pipeline per primary now.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{RETENTION, Target, unique_prefix};
use dedup_core::{Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Key};
use dedup_redis::RedisConfig;

const TASKS: usize = 16;
const KEYS: usize = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_claim_and_commit_1000_fresh_keys_each() {
    for target in Target::all("sixteen_tasks_claim_and_commit_1000_fresh_keys_each") {
        let name = &target.name();
        let store = Arc::new(
            target
                .open(RedisConfig {
                    prefix: unique_prefix("large_batches"),
                    retention: RETENTION,
                    ..RedisConfig::default()
                })
                .await,
        );
        let options = ClaimOptions::lease(Duration::from_secs(60));
        let started = Instant::now();
        let tasks = (0..TASKS).map(|t| {
            let store = Arc::clone(&store);
            let options = options.clone();
            tokio::spawn(async move {
                let requests: Vec<ClaimRequest> = (0..KEYS)
                    .map(|i| {
                        let key = Key::new(format!("task-{t}"), format!("m{i}")).unwrap();
                        ClaimRequest::new(key, options.clone())
                    })
                    .collect();
                let claims = store.claim_many(&requests).await.expect("claim_many");
                let commits: Vec<CommitRequest> = claims
                    .into_iter()
                    .map(|c| match c.expect("claim") {
                        Claim::Acquired(lease) => CommitRequest {
                            outcome: Some(lease.key.message_id().as_bytes().to_vec()),
                            lease,
                        },
                        other => panic!("a fresh key was not acquired: {other:?}"),
                    })
                    .collect();
                for result in store.commit_many(&commits).await.expect("commit_many") {
                    result.expect("commit");
                }
                requests
            })
        });
        let batches = futures::future::try_join_all(tasks).await.expect("a task");
        let took = started.elapsed();
        // Every key ends completed, with its own outcome.
        for requests in &batches {
            let again = store.claim_many(requests).await.expect("claim_many again");
            assert_eq!(again.len(), KEYS, "{name}");
            for (request, claim) in requests.iter().zip(again) {
                match claim.expect("claim again") {
                    Claim::Completed { outcome, .. } => assert_eq!(
                        outcome.as_deref(),
                        Some(request.key.message_id().as_bytes()),
                        "{name}: {:?}",
                        request.key
                    ),
                    other => panic!("{name}: {:?} is not completed: {other:?}", request.key),
                }
            }
        }
        eprintln!("{name}: {TASKS} tasks x {KEYS} keys claimed and committed in {took:?}");
    }
}
