//! A concurrent workload that produces interesting histories: many tasks claiming,
//! committing, renewing, releasing and reading a few keys with short leases, so that
//! leases expire by real time and are taken over while their old holders still act.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dedup_core::{ClaimOptions, Clock, DedupStore, Key, Lease};
use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};

use super::{CheckOptions, CheckSummary, History, Recorder, check};

/// The shape of a [`record_workload`] run.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Concurrent tasks.
    pub tasks: usize,
    /// Calls each task makes.
    pub calls_per_task: usize,
    /// Keys in use at a time. Every `calls_per_epoch` calls a task moves on to fresh keys,
    /// so the history keeps acquiring instead of settling on completed keys.
    pub keys: usize,
    /// See `keys`.
    pub calls_per_epoch: usize,
    /// Leases are drawn from this range (milliseconds); pauses between calls are up to
    /// half its upper end, so leases regularly expire in the middle of a task's work.
    pub lease_ms: (u64, u64),
    /// The consumer of every key.
    pub consumer: String,
    /// Seed of the tasks' random choices (printed by [`assert_linearizable`]).
    pub seed: u64,
}

impl Default for Workload {
    /// 8 tasks × 60 calls over 4 keys at a time (fresh keys every 20 calls), leases of 15
    /// to 60 ms, a random seed.
    fn default() -> Self {
        Workload {
            tasks: 8,
            calls_per_task: 60,
            keys: 4,
            calls_per_epoch: 20,
            lease_ms: (15, 60),
            consumer: "linearizability".into(),
            seed: u64::from_le_bytes(
                uuid::Uuid::new_v4().as_bytes()[..8]
                    .try_into()
                    .unwrap_or_default(),
            ),
        }
    }
}

fn rng(seed: u64, task: usize) -> TestRng {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..16].copy_from_slice(&(task as u64).to_le_bytes());
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

fn below(rng: &mut TestRng, n: u64) -> u64 {
    rng.next_u64() % n.max(1)
}

/// One task's calls: the leases it holds are remembered per key and used for commits,
/// renewals and releases, including after they expired and were taken over.
async fn task<S: DedupStore>(store: Recorder<S>, task: usize, w: Workload) {
    let mut rng = rng(w.seed, task);
    let mut held: HashMap<Key, Lease> = HashMap::new();
    let (min, max) = w.lease_ms;
    for i in 0..w.calls_per_task {
        let epoch = i / w.calls_per_epoch.max(1);
        let id = format!("e{epoch}-k{}", below(&mut rng, w.keys as u64));
        let key = Key::new(w.consumer.as_str(), id).expect("valid key");
        let lease = Duration::from_millis(min + below(&mut rng, max - min + 1));
        let roll = below(&mut rng, 100);
        let _ = match held.get(&key).cloned() {
            Some(lease_held) if roll < 30 => {
                let outcome = format!("task {task} call {i}");
                let r = store.commit(&lease_held, Some(outcome.as_bytes())).await;
                held.remove(&key);
                r.map(|_| ())
            }
            Some(lease_held) if roll < 45 => {
                held.remove(&key);
                store.release(&lease_held).await
            }
            Some(lease_held) if roll < 70 => store.renew(&lease_held, lease).await.map(|renewed| {
                held.insert(key.clone(), renewed);
            }),
            _ if roll >= 90 => store.get(&key).await.map(|_| ()),
            _ => {
                let options = ClaimOptions::lease(lease);
                store.claim(&key, &options).await.map(|claim| {
                    if let Some(lease) = claim.into_lease() {
                        held.insert(key.clone(), lease);
                    }
                })
            }
        };
        tokio::time::sleep(Duration::from_millis(below(&mut rng, max / 2 + 1))).await;
    }
}

/// Run `workload` with its tasks spread over `stores` (handles on the same records), each
/// call recorded with `clock` (see [`Recorder::new`]), and return the history.
pub async fn record_workload<S>(
    stores: Vec<S>,
    clock: Arc<dyn Clock>,
    workload: &Workload,
) -> History
where
    S: DedupStore + Clone + 'static,
{
    assert!(
        !stores.is_empty(),
        "record_workload needs at least one store"
    );
    let recorder = Recorder::new(stores[0].clone(), clock);
    let tasks: Vec<_> = (0..workload.tasks)
        .map(|t| {
            let store = recorder.for_task(stores[t % stores.len()].clone(), t);
            tokio::spawn(task(store, t, workload.clone()))
        })
        .collect();
    for t in tasks {
        t.await.expect("a workload task panicked");
    }
    recorder.history()
}

/// Record `workload` on `stores` and require the history to be linearizable; panics with
/// the seed and the readable history of the offending key otherwise. Returns what was
/// checked.
pub async fn assert_linearizable<S>(
    stores: Vec<S>,
    clock: Arc<dyn Clock>,
    workload: &Workload,
) -> CheckSummary
where
    S: DedupStore + Clone + 'static,
{
    let history = record_workload(stores, clock, workload).await;
    match check(&history, &CheckOptions::default()) {
        Ok(summary) => {
            println!("linearizable (seed {}): {summary:?}", workload.seed);
            assert!(
                summary.takeovers > 0,
                "the workload took no key over by expiry (seed {}): make leases shorter",
                workload.seed
            );
            summary
        }
        Err(e) => panic!("seed {}: {e}", workload.seed),
    }
}
