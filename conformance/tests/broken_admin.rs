//! Proof that the admin clauses can fail: each runs against a `MemoryStore` whose operator
//! extension has one deliberate fault, and the clause named for that fault must catch it.
//! The same wrapper without a fault passes every admin clause.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use async_trait::async_trait;
use dedup_conformance::clauses::admin_clauses;
use dedup_conformance::{Namespaces, StoreFactory, TestContext};
use dedup_core::admin::{Admin, Forgot, ListFilter, PurgeCount, Released, Stats, Status};
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, ItemResult, Key,
    Lease, MemoryStore, PurgeOptions, PurgeReport, PurgeRun, Record, RecordState, Result,
    Timestamp,
};
use futures::FutureExt;

/// One thing the operator extension gets wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// `list` shows every consumer's records.
    ListIgnoresTheConsumer,
    /// `list` starts at `after` instead of after it (pages repeat a record).
    ListAfterIsInclusive,
    /// `stats` counts expired leases as live.
    StatsCountExpiredAsLive,
    /// `stats` counts dead letters as processed (completed).
    StatsCountDeadLettersAsProcessed,
    /// `release_key` says it released a live lease without `force`.
    ReleaseIgnoresForce,
    /// `release_key` reports a release and changes nothing.
    ReleaseDoesNothing,
    /// The dry run purges.
    DryRunPurges,
    /// `release_key` is a worker's fenced release of the lease read: the token stays, so
    /// the holder still commits until the key is claimed again.
    ReleaseKeepsTheToken,
    /// `forget` reports a removal and changes nothing.
    ForgetLeavesTheRecord,
    /// `forget` removes a live lease without `force`.
    ForgetIgnoresForce,
    /// A forced `forget` of a live lease revokes it (as `release_key`) instead of removing
    /// the record, and reports a removal.
    ForgetForcedOnlyRevokes,
    /// `forget` of an absent key reports a removed expired record.
    ForgetAbsentReportsARemoval,
    /// No purge run is kept.
    PurgeRunsAreNotKept,
    /// The kept run never says it stopped early.
    PurgeRunNeverStoppedEarly,
}

/// `MemoryStore` with an optional fault in its [`Admin`] implementation.
#[derive(Clone)]
struct Faulty {
    inner: MemoryStore,
    fault: Option<Fault>,
}

#[async_trait]
impl DedupStore for Faulty {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        self.inner.claim(key, options).await
    }
    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        self.inner.claim_many(requests).await
    }
    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        self.inner.renew(lease, extend_by).await
    }
    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        self.inner.commit(lease, outcome).await
    }
    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        self.inner.commit_many(requests).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }
    async fn release_failed(&self, lease: &Lease, failure: &dedup_core::Failure) -> Result<()> {
        self.inner.release_failed(lease, failure).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        self.inner.get(key).await
    }
    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        self.inner.purge(options).await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

#[async_trait]
impl Admin for Faulty {
    async fn now(&self) -> Result<Timestamp> {
        self.inner.now().await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        filter.validate()?;
        let now = self.inner.now().await?;
        let after = filter.after.as_deref().unwrap_or("");
        Ok(self
            .inner
            .snapshot()
            .into_iter()
            .filter(|r| match self.fault {
                Some(Fault::ListIgnoresTheConsumer) => true,
                _ => r.key.consumer() == filter.consumer,
            })
            .filter(|r| match self.fault {
                Some(Fault::ListAfterIsInclusive) => r.key.message_id() >= after,
                _ => r.key.message_id() > after,
            })
            .filter(|r| {
                filter
                    .status
                    .is_none_or(|s| dedup_core::Status::of(r, now) == s)
            })
            .take(filter.limit)
            .collect())
    }

    async fn stats(&self, top: usize) -> Result<Stats> {
        let mut stats = self.inner.stats(top).await?;
        if self.fault == Some(Fault::StatsCountExpiredAsLive) {
            stats.in_flight += stats.expired;
            stats.expired = 0;
        }
        if self.fault == Some(Fault::StatsCountDeadLettersAsProcessed) {
            stats.completed += stats.dead_lettered;
            stats.dead_lettered = 0;
        }
        Ok(stats)
    }

    async fn consumers(&self) -> Result<Vec<dedup_core::admin::ConsumerCounts>> {
        self.inner.consumers().await
    }

    async fn count_purgeable(&self, retention: Duration) -> Result<PurgeCount> {
        let count = self.inner.count_purgeable(retention).await?;
        if self.fault == Some(Fault::DryRunPurges) {
            self.inner
                .purge(&PurgeOptions::older_than(retention).unpaced())
                .await?;
        }
        Ok(count)
    }

    async fn last_purge(&self) -> Result<Option<PurgeRun>> {
        let run = self.inner.last_purge().await?;
        Ok(match self.fault {
            Some(Fault::PurgeRunsAreNotKept) => None,
            Some(Fault::PurgeRunNeverStoppedEarly) => run.map(|r| PurgeRun {
                stopped_early: false,
                ..r
            }),
            _ => run,
        })
    }

    async fn release_key(&self, key: &Key, force: bool) -> Result<Released> {
        match self.fault {
            Some(Fault::ReleaseIgnoresForce) => self.inner.release_key(key, true).await,
            Some(Fault::ReleaseDoesNothing) => match self.inner.get(key).await? {
                Some(r) => Ok(Released::Released {
                    fence: r.fence,
                    attempt: r.attempt,
                    was_live: true,
                }),
                None => Ok(Released::NotFound),
            },
            Some(Fault::ReleaseKeepsTheToken) => fenced_release(&self.inner, key, force).await,
            _ => self.inner.release_key(key, force).await,
        }
    }

    async fn forget(&self, key: &Key, force: bool) -> Result<Forgot> {
        let now = self.inner.now().await?;
        let record = self.inner.get(key).await?;
        match (self.fault, &record) {
            (Some(Fault::ForgetLeavesTheRecord), Some(r)) => Ok(Forgot::Forgot {
                status: Status::of(r, now),
                fence: r.fence,
                attempt: r.attempt,
            }),
            (Some(Fault::ForgetIgnoresForce), _) => self.inner.forget(key, true).await,
            (Some(Fault::ForgetForcedOnlyRevokes), Some(r))
                if force && Status::of(r, now) == Status::InFlight =>
            {
                self.inner.release_key(key, true).await?;
                Ok(Forgot::Forgot {
                    status: Status::InFlight,
                    fence: r.fence,
                    attempt: r.attempt,
                })
            }
            (Some(Fault::ForgetAbsentReportsARemoval), None) => Ok(Forgot::Forgot {
                status: Status::Expired,
                fence: 1,
                attempt: 1,
            }),
            _ => self.inner.forget(key, force).await,
        }
    }
}

/// What `release_key` was before it revoked: a worker's fenced release of the lease read,
/// keeping its token.
async fn fenced_release(store: &MemoryStore, key: &Key, force: bool) -> Result<Released> {
    let now = store.now().await?;
    let Some(record) = store.get(key).await? else {
        return Ok(Released::NotFound);
    };
    let (token, expires_at) = match record.state {
        RecordState::Completed { processed_at, .. } => {
            return Ok(Released::Completed { processed_at });
        }
        RecordState::InFlight { token, expires_at } => (token, expires_at),
    };
    let was_live = now < expires_at;
    if was_live && !force {
        return Ok(Released::LiveLease {
            expires_at,
            attempt: record.attempt,
        });
    }
    let lease = Lease {
        key: key.clone(),
        token,
        fence: record.fence,
        attempt: record.attempt,
        expires_at,
    };
    store.release(&lease).await?;
    Ok(Released::Released {
        fence: record.fence,
        attempt: record.attempt,
        was_live,
    })
}

struct FaultyAdminFactory {
    fault: Option<Fault>,
    stores: Namespaces<Faulty>,
}

#[async_trait]
impl StoreFactory for FaultyAdminFactory {
    type Store = Faulty;

    async fn open(&self, ctx: &TestContext) -> Faulty {
        self.stores.open(ctx, || Faulty {
            inner: MemoryStore::with_clock(ctx.clock.clone()),
            fault: self.fault,
        })
    }
}

/// The admin clauses that fail against `fault`.
async fn failing(fault: Option<Fault>) -> Vec<&'static str> {
    let factory = FaultyAdminFactory {
        fault,
        stores: Namespaces::default(),
    };
    let mut failed = Vec::new();
    for clause in admin_clauses() {
        if AssertUnwindSafe((clause.run)(&factory))
            .catch_unwind()
            .await
            .is_err()
        {
            failed.push(clause.name);
        }
    }
    failed
}

#[tokio::test]
async fn each_admin_fault_is_caught_by_its_clause() {
    let cases = [
        (
            Fault::ListIgnoresTheConsumer,
            "listing_never_shows_another_consumers_records",
        ),
        (
            Fault::ListAfterIsInclusive,
            "list_filters_by_status_and_pages_in_message_id_order",
        ),
        (Fault::StatsCountExpiredAsLive, "counts_equal_what_get_sees"),
        (
            Fault::StatsCountDeadLettersAsProcessed,
            "completed_records_are_processed_failed_or_dead_lettered",
        ),
        (
            Fault::ReleaseIgnoresForce,
            "operator_release_of_a_live_lease_needs_force",
        ),
        (
            Fault::ReleaseDoesNothing,
            "operator_release_then_reclaim_gives_the_next_fence_and_the_old_lease_is_lost",
        ),
        (
            Fault::DryRunPurges,
            "count_purgeable_equals_what_purge_removes",
        ),
        (
            Fault::ReleaseKeepsTheToken,
            "operator_release_revokes_the_holder_at_once",
        ),
        (
            Fault::ForgetLeavesTheRecord,
            "forget_removes_a_completed_or_expired_record_and_the_key_starts_over",
        ),
        (
            Fault::ForgetIgnoresForce,
            "forget_of_a_live_lease_without_force_changes_nothing",
        ),
        (
            Fault::ForgetForcedOnlyRevokes,
            "forget_with_force_removes_a_live_lease_and_its_holder_loses_it",
        ),
        (
            Fault::ForgetAbsentReportsARemoval,
            "forget_of_an_absent_key_is_not_found",
        ),
        (
            Fault::PurgeRunsAreNotKept,
            "a_finished_purge_is_kept_as_the_last_run",
        ),
        (
            Fault::PurgeRunNeverStoppedEarly,
            "a_finished_purge_is_kept_as_the_last_run",
        ),
    ];
    for (fault, clause) in cases {
        let failed = failing(Some(fault)).await;
        println!("{fault:?} is caught by {failed:?}");
        assert!(
            failed.contains(&clause),
            "{fault:?} must be caught by {clause}: {failed:?}"
        );
    }
}

#[tokio::test]
async fn the_wrapper_without_a_fault_passes_every_admin_clause() {
    assert_eq!(failing(None).await, Vec::<&str>::new());
}
