//! Several purgers and many claimers at once on a large table: no deadlock, every
//! eligible record removed exactly once, no live lease removed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_core::{
    Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Key, Lease, ManualClock, Pace,
    PurgeOptions, PurgeReport, RecordState,
};

/// The shape of [`purgers_and_claimers_at_once`].
#[derive(Clone, Debug)]
pub struct Purging {
    /// Records written before the purge, all eligible once the clock moves: one in ten
    /// completed, the others in-flight claims whose short lease expired (claims only:
    /// the cheapest way to write many records through the trait).
    pub records: usize,
    /// Concurrent purgers.
    pub purgers: usize,
    /// Records one purge batch removes at most.
    pub batch_size: usize,
    /// How the purges pace themselves. Default [`Pace::Unpaced`]: batches back to back,
    /// the most contended case (the one where deadlocks and double removals would show)
    /// and the fastest.
    pub pace: Pace,
    /// Concurrent claimers, running while the purgers run.
    pub claimers: usize,
    /// Calls each claimer makes: fresh keys (a live lease, committed every other time) and
    /// old keys (which a purge may have removed or not yet).
    pub claims_per_claimer: usize,
    /// Fail when the purge has not finished by then (a deadlock, or far too slow).
    pub deadline: Duration,
}

impl Default for Purging {
    /// 200 000 records, 4 unpaced purgers in batches of 1000, 8 claimers of 100 claims,
    /// 120 s.
    fn default() -> Self {
        Purging {
            records: 200_000,
            purgers: 4,
            batch_size: 1000,
            pace: Pace::Unpaced,
            claimers: 8,
            claims_per_claimer: 100,
            deadline: Duration::from_secs(120),
        }
    }
}

/// What [`purgers_and_claimers_at_once`] measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PurgeFigures {
    /// Records eligible when the purge started.
    pub eligible: u64,
    /// The purgers' reports, added up.
    pub purged: PurgeReport,
    /// Leases the claimers acquired during the purge (all still held or committed after).
    pub leases_during_purge: u64,
    /// Time to write the records.
    pub insert: Duration,
    /// Time from starting the purgers to the last one finishing.
    pub purge: Duration,
}

const RETENTION: Duration = Duration::from_secs(3600);
const LIVE: Duration = Duration::from_secs(4 * 3600);

fn old_key(i: usize) -> Key {
    Key::new("purgers", format!("old-{i}")).expect("valid key")
}

/// Write `range` of the old records with batches: claims, then commits of one in ten.
async fn insert<S: DedupStore>(store: &S, range: std::ops::Range<usize>) {
    let requests: Vec<ClaimRequest> = range
        .clone()
        .map(|i| {
            let lease = if i % 10 == 0 {
                LIVE
            } else {
                Duration::from_secs(1)
            };
            ClaimRequest::new(old_key(i), ClaimOptions::lease(lease))
        })
        .collect();
    let claims = store.claim_many(&requests).await.expect("claim_many");
    let commits: Vec<CommitRequest> = claims
        .into_iter()
        .zip(range)
        .filter(|(_, i)| i % 10 == 0)
        .map(|(claim, i)| CommitRequest {
            lease: claim
                .expect("claim item")
                .into_lease()
                .unwrap_or_else(|| panic!("old-{i} must be acquired")),
            outcome: None,
        })
        .collect();
    for result in store.commit_many(&commits).await.expect("commit_many") {
        result.expect("commit item");
    }
}

/// One claimer: fresh keys (live leases, half of them committed) and old completed keys.
async fn claimer<S: DedupStore>(store: S, c: usize, shape: Purging) -> Vec<Lease> {
    let mut held = Vec::new();
    let options = ClaimOptions::lease(LIVE);
    for n in 0..shape.claims_per_claimer {
        let key = match n % 2 {
            0 => Key::new("purgers", format!("fresh-{c}-{n}")).expect("valid key"),
            // An old completed key (a claim of an expired in-flight one would take it over
            // and make it live, no longer eligible).
            _ => old_key((c * 7919 + n * 104_729) % shape.records.div_ceil(10) * 10),
        };
        match store
            .claim(&key, &options)
            .await
            .expect("claim during purge")
        {
            Claim::Acquired(lease) => {
                if n % 4 == 0 {
                    store
                        .commit(&lease, None)
                        .await
                        .expect("commit during purge");
                }
                held.push(lease);
            }
            Claim::Completed { .. } | Claim::InFlight { .. } => {}
        }
    }
    held
}

/// Write `shape.records` eligible records through `stores` (handles on the same records
/// whose clock is `clock`), move the clock past the retention, then run `shape.purgers`
/// purges and `shape.claimers` claimers at once, and check (panicking on a violation):
/// - every purge finishes before the deadline (no deadlock);
/// - the purge reports add up to exactly the eligible records (each removed once), split
///   into completed and expired as written, and a further purge finds nothing;
/// - every lease the claimers acquired is still held, or committed by its holder.
pub async fn purgers_and_claimers_at_once<S>(
    stores: Vec<S>,
    clock: Arc<ManualClock>,
    shape: &Purging,
) -> PurgeFigures
where
    S: DedupStore + Clone + 'static,
{
    assert!(!stores.is_empty(), "at least one store");
    let started = Instant::now();
    let chunks: Vec<usize> = (0..shape.records)
        .step_by(dedup_core::MAX_BATCH_LEN)
        .collect();
    let writers = stores.len().max(4);
    let mut tasks = Vec::new();
    for w in 0..writers {
        let store = stores[w % stores.len()].clone();
        let mine: Vec<usize> = chunks.iter().copied().skip(w).step_by(writers).collect();
        let records = shape.records;
        tasks.push(tokio::spawn(async move {
            for start in mine {
                insert(
                    &store,
                    start..(start + dedup_core::MAX_BATCH_LEN).min(records),
                )
                .await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("an inserting task panicked");
    }
    let insert_time = started.elapsed();
    clock.advance(RETENTION + Duration::from_secs(60));
    let expired = (shape.records - shape.records.div_ceil(10)) as u64;
    let eligible = shape.records as u64;

    let purge_started = Instant::now();
    let options = PurgeOptions::older_than(RETENTION)
        .batch_size(shape.batch_size)
        .pace(shape.pace);
    let purgers: Vec<_> = (0..shape.purgers)
        .map(|p| {
            let (store, options) = (stores[p % stores.len()].clone(), options.clone());
            tokio::spawn(async move { store.purge(&options).await.expect("purge") })
        })
        .collect();
    let claimers: Vec<_> = (0..shape.claimers)
        .map(|c| {
            let store = stores[c % stores.len()].clone();
            tokio::spawn(claimer(store, c, shape.clone()))
        })
        .collect();
    let everything = async {
        let mut purged = PurgeReport::default();
        for p in purgers {
            let report = p.await.expect("a purger panicked");
            purged.completed += report.completed;
            purged.expired += report.expired;
            purged.batches += report.batches;
        }
        let purge_time = purge_started.elapsed();
        let mut leases = Vec::new();
        for c in claimers {
            leases.extend(c.await.expect("a claimer panicked"));
        }
        (purged, purge_time, leases)
    };
    let (purged, purge_time, leases) = tokio::time::timeout(shape.deadline, everything)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "purgers and claimers still running after {:?}",
                shape.deadline
            )
        });
    assert_eq!(
        (purged.total(), purged.expired),
        (eligible, expired),
        "the purges must remove each eligible record exactly once ({eligible}, of which \
         {expired} expired leases): {purged:?}"
    );
    let again = stores[0].purge(&options).await.expect("purge");
    assert_eq!(again.total(), 0, "a record was left behind: {again:?}");
    for lease in &leases {
        let record = stores[0].get(&lease.key).await.expect("get");
        let kept = match record.as_ref().map(|r| &r.state) {
            Some(RecordState::InFlight { token, .. }) => *token == lease.token,
            Some(RecordState::Completed { token, .. }) => *token == Some(lease.token),
            None => false,
        };
        assert!(kept, "{}: a live lease was removed: {record:?}", lease.key);
    }
    PurgeFigures {
        eligible,
        purged,
        leases_during_purge: leases.len() as u64,
        insert: insert_time,
        purge: purge_time,
    }
}
