//! The scenario every server-backed store runs through a [`Proxy`]: many tasks deliver
//! the same keys (redeliveries included) and claim, commit and retry through connections
//! that are cut at random; afterwards the store must hold the contract's invariants.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dedup_core::{Claim, ClaimOptions, DedupStore, Error, Key, Lease, RecordState, Result};

use super::{Cuts, Proxy};

/// The shape of [`retried_operations_converge`].
#[derive(Clone, Debug)]
pub struct Converging {
    /// Concurrent tasks; each delivers every key once (so every key is delivered `tasks`
    /// times).
    pub tasks: usize,
    /// Keys.
    pub keys: usize,
    /// The lease of every claim: a claim whose reply was cut holds its key this long.
    pub lease: Duration,
    /// Give up (fail) when the keys are not all completed by then.
    pub deadline: Duration,
}

impl Default for Converging {
    /// 6 tasks, 32 keys, 200 ms leases, 60 s deadline.
    fn default() -> Self {
        Converging {
            tasks: 6,
            keys: 32,
            lease: Duration::from_millis(200),
            deadline: Duration::from_secs(60),
        }
    }
}

/// What happened in [`retried_operations_converge`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConvergeReport {
    /// Calls made (retries included).
    pub calls: u64,
    /// Calls that failed with a retryable error (and were retried).
    pub retried: u64,
    /// Claims that acquired.
    pub acquired: u64,
    /// Claims that answered `InFlight` (another task's lease, or our own claim whose reply
    /// was cut) and waited.
    pub waited: u64,
    /// Commits that answered `LeaseLost` (the lease had expired and was taken over).
    pub lease_lost: u64,
    /// What the proxy cut.
    pub cuts: Cuts,
}

#[derive(Default)]
struct Log {
    report: ConvergeReport,
    /// Per key: every lease acquired, as (fence, start by the store's clock, lease).
    acquired: HashMap<Key, Vec<Lease>>,
    /// Per key: the leases whose commit answered `Ok`.
    committed: HashMap<Key, Vec<Lease>>,
    /// Leases whose commit answered `LeaseLost`.
    lost: Vec<Lease>,
}

type Shared = Arc<Mutex<Log>>;

fn log(shared: &Shared) -> std::sync::MutexGuard<'_, Log> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// Call `op` until it returns anything but a retryable error; a non-retryable backend
/// error fails the scenario.
async fn retried<T, F, Fut>(shared: &Shared, what: &str, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    loop {
        log(shared).report.calls += 1;
        match op().await {
            Err(e) if e.is_retryable() => {
                log(shared).report.retried += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e @ Error::Backend { .. }) => {
                panic!("{what}: a non-retryable error through the proxy: {e:?}")
            }
            other => return other,
        }
    }
}

/// Deliver `key` until it is completed: claim (retried), commit (retried); wait out a
/// live lease (possibly our own, whose reply was cut); claim again after `LeaseLost`.
/// A slow worker (`slow`) sleeps past its lease before committing, so that other tasks
/// take the key over and its commit answers `LeaseLost`, or commits an expired lease
/// nobody took.
async fn deliver<S: DedupStore>(
    store: &S,
    key: &Key,
    slow: bool,
    shape: &Converging,
    shared: &Shared,
) {
    let started = Instant::now();
    let options = ClaimOptions::lease(shape.lease);
    loop {
        assert!(
            started.elapsed() < shape.deadline,
            "{key} did not converge within {:?}",
            shape.deadline
        );
        let claim = retried(shared, "claim", || store.claim(key, &options))
            .await
            .unwrap_or_else(|e| panic!("claim of {key}: {e:?}"));
        let lease = match claim {
            Claim::Completed { .. } => return,
            Claim::InFlight { .. } => {
                log(shared).report.waited += 1;
                tokio::time::sleep(shape.lease / 4).await;
                continue;
            }
            Claim::Acquired(lease) => lease,
        };
        {
            let mut log = log(shared);
            log.report.acquired += 1;
            log.acquired
                .entry(key.clone())
                .or_default()
                .push(lease.clone());
        }
        if slow {
            tokio::time::sleep(shape.lease * 3 / 2).await;
        }
        match retried(shared, "commit", || store.commit(&lease, Some(b"done"))).await {
            Ok(()) => {
                log(shared)
                    .committed
                    .entry(key.clone())
                    .or_default()
                    .push(lease);
                return;
            }
            Err(Error::LeaseLost { .. }) => {
                let mut log = log(shared);
                log.report.lease_lost += 1;
                log.lost.push(lease);
            }
            Err(e) => panic!("commit of {key}: {e:?}"),
        }
    }
}

/// Run the scenario: `shape.tasks` tasks, each on one of `through` (stores connected
/// through `proxy`), deliver every key (one delivery in 7 commits only after its lease
/// expired); then cutting stops and `direct` (a store on the
/// same records, not through the proxy) checks the invariants, panicking on a violation:
/// - the proxy cut replies, and calls were retried (the scenario tested something);
/// - every call returned `Ok` or a retryable error (retried until it did not);
/// - every key is completed (retries converged);
/// - one completion per key: every commit that answered `Ok` for a key carried the same
///   token, the one the record was completed by;
/// - fences increase: the leases acquired for a key have distinct fences, in the order
///   they started (by the store's clock), and the record's fence is at least the highest;
/// - no live lease lost: each acquisition started no earlier than the previous lease of
///   its key expired, and every commit that answered `LeaseLost` had a successor.
pub async fn retried_operations_converge<S, D>(
    through: Vec<S>,
    direct: &D,
    proxy: &Proxy,
    shape: &Converging,
) -> ConvergeReport
where
    S: DedupStore + Clone + 'static,
    D: DedupStore + ?Sized,
{
    assert!(!through.is_empty(), "at least one store through the proxy");
    let keys: Vec<Key> = (0..shape.keys)
        .map(|i| Key::new("proxy", format!("m{i}")).expect("valid key"))
        .collect();
    let shared: Shared = Arc::default();
    let tasks: Vec<_> = (0..shape.tasks)
        .map(|t| {
            let store = through[t % through.len()].clone();
            let (shared, shape) = (shared.clone(), shape.clone());
            let mut order = keys.clone();
            order.rotate_left(t * keys.len() / shape.tasks.max(1));
            tokio::spawn(async move {
                for (i, key) in order.iter().enumerate() {
                    let slow = (i + t) % 7 == 0;
                    deliver(&store, key, slow, &shape, &shared).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a delivering task panicked");
    }
    proxy.set_cutting(false);
    // Every task has ended: take the log out of its lock.
    let mut log = std::mem::take(&mut *log(&shared));
    log.report.cuts = proxy.cuts();
    println!("{:#?}", log.report);
    assert!(
        log.report.cuts.before_reply > 0 && log.report.retried > 0,
        "the proxy must have cut replies and the store retried: {:?}",
        log.report
    );
    for key in &keys {
        check_key(direct, key, &log, shape.lease).await;
    }
    for lease in &log.lost {
        let record = direct
            .get(&lease.key)
            .await
            .expect("get")
            .expect("a record");
        assert!(
            record.fence > lease.fence,
            "{}: a commit with fence {} was LeaseLost, yet nobody took the key over",
            lease.key,
            lease.fence
        );
    }
    log.report
}

async fn check_key<D: DedupStore + ?Sized>(direct: &D, key: &Key, log: &Log, lease: Duration) {
    let record = direct
        .get(key)
        .await
        .unwrap_or_else(|e| panic!("get of {key}: {e:?}"))
        .unwrap_or_else(|| panic!("{key}: no record; the retries did not converge"));
    let RecordState::Completed { token, .. } = record.state else {
        panic!("{key}: not completed: {record:?}");
    };
    let committed = log
        .committed
        .get(key)
        .map(Vec::as_slice)
        .unwrap_or_default();
    assert!(
        !committed.is_empty(),
        "{key}: completed, but no commit answered Ok"
    );
    for c in committed {
        assert_eq!(
            Some(c.token),
            token,
            "{key}: a commit answered Ok for a token the record was not completed by \
             (two completions)"
        );
    }
    let mut acquired = log.acquired.get(key).cloned().unwrap_or_default();
    acquired.sort_by_key(|l| l.fence);
    for pair in acquired.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(a.fence < b.fence, "{key}: fence {} acquired twice", a.fence);
        let b_start = b.expires_at.saturating_sub(lease);
        assert!(
            b_start >= a.expires_at,
            "{key}: fence {} was acquired at {b_start} while fence {}'s lease was live until {}",
            b.fence,
            a.fence,
            a.expires_at
        );
    }
    if let Some(last) = acquired.last() {
        assert!(
            record.fence >= last.fence,
            "{key}: the record's fence {} is below an acquired fence {}",
            record.fence,
            last.fence
        );
    }
}
