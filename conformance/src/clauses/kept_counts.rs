//! Kept counts ([`Admin::enable_counts`]), for stores that can keep them: after any mix of
//! operations the kept counts equal what reading every record finds, enabling on a store
//! that holds records starts from the right counts, and disabling goes back to the scan.
//! Not part of `admin_suite!` (stores that cannot keep counts answer `Unsupported`); a
//! backend that keeps counts calls the clause from a test of its own, and can run
//! `admin_suite!` over [`KeptCounts`] to check every admin clause with counts kept.

use std::time::Duration;

use async_trait::async_trait;
use dedup_core::admin::{Admin, ConsumerCounts, CountSource, ListFilter, Stats, Status};
use dedup_core::{
    ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Failure, PurgeOptions, Result, Verdict,
};

use crate::support::{LEASE, acquire, commit_ok, key_for, release_ok, setup};
use crate::{StoreFactory, TestContext};

/// A factory whose stores keep counts: `F`'s stores, with [`Admin::enable_counts`] run on
/// each when it opens (a second handle on the same records finds them kept already).
pub struct KeptCounts<F>(pub F);

#[async_trait]
impl<F: StoreFactory> StoreFactory for KeptCounts<F>
where
    F::Store: Admin,
{
    type Store = F::Store;

    async fn open(&self, ctx: &TestContext) -> Self::Store {
        let store = self.0.open(ctx).await;
        store
            .enable_counts()
            .await
            .unwrap_or_else(|e| panic!("enable_counts on {} failed: {e:?}", ctx.namespace));
        store
    }

    fn available(&self) -> bool {
        self.0.available()
    }

    async fn open_named(&self, ctx: &TestContext, name: &str) -> Option<Result<Self::Store>> {
        self.0.open_named(ctx, name).await
    }

    /// A quarter of the inner factory's histories (at most 64 by default): the same store
    /// runs them all without counts in its own suite, and each history here makes a fresh
    /// table with its triggers (over a minute for 256 on MariaDB).
    fn model_cases(&self) -> Option<u32> {
        let inner = self
            .0
            .model_cases()
            .unwrap_or_else(|| crate::model::model_config().cases);
        Some((inner / 4).max(1))
    }
}

/// Every record of every consumer, read with `list` one page at a time, counted by
/// status: the scan the kept counts must agree with (not the store's own aggregate).
async fn listed_counts<S: Admin + ?Sized>(store: &S, consumers: &[&str]) -> Vec<ConsumerCounts> {
    let now = store.now().await.expect("now");
    let mut records = Vec::new();
    for consumer in consumers {
        let mut filter = ListFilter::consumer(*consumer).limit(7);
        loop {
            let page = store.list(&filter).await.expect("list");
            let full = page.len() == filter.limit;
            if let Some(last) = page.last() {
                filter = filter.after(last.key.message_id());
            }
            records.extend(page);
            if !full {
                break;
            }
        }
    }
    ConsumerCounts::tally(&records, now)
}

/// The store-wide counts of `consumers`, as [`Stats`] has them.
fn summed(consumers: &[ConsumerCounts]) -> [u64; 5] {
    Status::ALL.map(|s| consumers.iter().map(|c| c.counts.count(s)).sum())
}

/// `consumers` and `stats` of `store` agree with a listing of every record, `when`.
async fn assert_counts_agree<S: Admin + ?Sized>(store: &S, consumers: &[&str], when: &str) {
    let listed = listed_counts(store, consumers).await;
    let got = store.consumers().await.expect("consumers");
    assert_eq!(
        got, listed,
        "{when}: consumers() must equal a count of every record listed"
    );
    let stats: Stats = store.stats(0).await.expect("stats");
    assert_eq!(
        Status::ALL.map(|s| stats.count(s)),
        summed(&listed),
        "{when}: stats() must count what the listing counts ({:?})",
        Status::ALL
    );
}

/// A failure to store or release with.
fn cause(ctx: &TestContext, attempt: u32) -> Failure {
    Failure::new("handler", vec!["boom".into()], attempt, ctx.now(), None)
}

/// Claims, commits (processed, failed, dead-lettered), releases with and without a
/// failure, renewals, takeovers, batches, forgets and a purge, on three consumers, with
/// kept counts enabled on a store already holding records: after each step the kept
/// counts equal a count of every record listed, with live and expired leases told apart
/// at the store's "now"; disabling returns to the scan, with the same counts.
pub async fn kept_counts_equal_a_scan_through_a_mixed_workload<F: StoreFactory>(factory: &F)
where
    F::Store: Admin,
{
    let (ctx, store) = setup(factory, "kept_counts_mixed_workload").await;
    let consumers = ["a", "b", "c"];
    let k = |c: &str, i: usize| key_for(c, &format!("m{i:03}"));
    assert_eq!(
        store.count_source().await.expect("count_source"),
        CountSource::Scan { keepable: true },
        "a new store reads every record, and can keep counts"
    );
    // Before counts are kept: processed, failed, dead-lettered, in flight, released.
    for i in 0..12 {
        let lease = acquire(&store, &k("a", i)).await;
        match i % 4 {
            0 => commit_ok(&store, &lease, Some(b"ok")).await,
            1 => commit_ok(&store, &lease, Some(&Verdict::failed(&cause(&ctx, 1)))).await,
            2 => commit_ok(&store, &lease, Some(&Verdict::dead_letter(1, None))).await,
            _ if i % 8 == 3 => release_ok(&store, &lease).await,
            _ => {}
        }
    }
    acquire(&store, &k("b", 0)).await;
    assert_counts_agree(&store, &consumers, "before enabling").await;

    assert!(
        store.enable_counts().await.expect("enable_counts"),
        "enabling changes the store"
    );
    assert!(
        !store.enable_counts().await.expect("enable_counts again"),
        "enabling again changes nothing"
    );
    assert_eq!(
        store.count_source().await.expect("count_source"),
        CountSource::Kept
    );
    assert_counts_agree(
        &store,
        &consumers,
        "just enabled on a store holding records",
    )
    .await;

    // Claims and commits of new keys, one by one and in batches.
    let mut leases = Vec::new();
    for i in 0..10 {
        leases.push(acquire(&store, &k("b", 100 + i)).await);
    }
    for (i, lease) in leases.iter().enumerate().take(6) {
        let outcome = match i % 3 {
            0 => b"done".to_vec(),
            1 => Verdict::failed(&cause(&ctx, lease.attempt)),
            _ => Verdict::dead_letter(lease.attempt, Some(&cause(&ctx, lease.attempt))),
        };
        commit_ok(&store, lease, Some(&outcome)).await;
    }
    // A retried commit changes nothing.
    commit_ok(&store, &leases[0], Some(b"done")).await;
    store
        .renew(&leases[6], Duration::from_secs(60))
        .await
        .expect("renew");
    release_ok(&store, &leases[7]).await;
    store
        .release_failed(&leases[8], &cause(&ctx, leases[8].attempt))
        .await
        .expect("release_failed");
    let batch: Vec<ClaimRequest> = (0..5)
        .map(|i| ClaimRequest::new(k("c", i), ClaimOptions::lease(LEASE)))
        .chain([ClaimRequest::new(k("c", 0), ClaimOptions::lease(LEASE))])
        .collect();
    let claimed = store.claim_many(&batch).await.expect("claim_many");
    let commits: Vec<CommitRequest> = claimed
        .into_iter()
        .filter_map(|c| c.ok().and_then(|c| c.into_lease()))
        .take(3)
        .map(|lease| CommitRequest {
            lease,
            outcome: Some(b"batched".to_vec()),
        })
        .collect();
    assert_eq!(commits.len(), 3, "the batch acquired its new keys");
    store.commit_many(&commits).await.expect("commit_many");
    assert_counts_agree(&store, &consumers, "after claims, commits, renew, releases").await;

    // Leases run out: live ones become expired, without any write.
    ctx.clock.advance(LEASE + Duration::from_secs(1));
    assert_counts_agree(&store, &consumers, "after the leases expired").await;

    // Takeovers of expired and released keys, then one commit.
    let taken = acquire(&store, &k("b", 107)).await;
    acquire(&store, &k("a", 3)).await;
    commit_ok(&store, &taken, Some(b"second try")).await;
    assert_counts_agree(&store, &consumers, "after takeovers").await;

    // Forgets: a completed record, an expired one, a live one by force.
    for (key, force) in [(k("a", 0), false), (k("b", 109), false), (k("a", 3), true)] {
        store.forget(&key, force).await.expect("forget");
    }
    // An operator release revokes a live lease (in flight either way).
    store
        .release_key(&k("b", 0), true)
        .await
        .expect("release_key");
    assert_counts_agree(&store, &consumers, "after forgets and an operator release").await;

    // Every record of consumer c forgotten: it leaves the list.
    for i in 0..5 {
        store.forget(&k("c", i), true).await.expect("forget c");
    }
    let names: Vec<String> = store
        .consumers()
        .await
        .expect("consumers")
        .into_iter()
        .map(|c| c.consumer)
        .collect();
    assert_eq!(
        names,
        ["a", "b"],
        "a consumer without records is not listed"
    );
    assert_counts_agree(
        &store,
        &consumers,
        "after a consumer's records were forgotten",
    )
    .await;

    // A purge removes completed and expired records older than the retention.
    ctx.clock.advance(Duration::from_secs(3_600));
    acquire(&store, &k("a", 500)).await;
    let purged = store
        .purge(&PurgeOptions::older_than(Duration::from_secs(60)).batch_size(4))
        .await
        .expect("purge");
    assert!(purged.total() > 0, "the purge removed records: {purged:?}");
    assert_counts_agree(&store, &consumers, "after a purge").await;

    let kept = store.consumers().await.expect("consumers");
    assert!(
        store.disable_counts().await.expect("disable_counts"),
        "disabling changes the store"
    );
    assert!(
        !store.disable_counts().await.expect("disable_counts again"),
        "disabling again changes nothing"
    );
    assert_eq!(
        store.count_source().await.expect("count_source"),
        CountSource::Scan { keepable: true }
    );
    assert_eq!(
        store.consumers().await.expect("consumers"),
        kept,
        "the scan after disabling counts what the kept counts said"
    );
    assert_counts_agree(&store, &consumers, "after disabling").await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryFactory;
    use dedup_core::MemoryStore;

    /// A memory factory that asks a number of model-based histories.
    struct Asking(u32, MemoryFactory);

    #[async_trait]
    impl StoreFactory for Asking {
        type Store = MemoryStore;

        async fn open(&self, ctx: &TestContext) -> MemoryStore {
            self.1.open(ctx).await
        }

        fn model_cases(&self) -> Option<u32> {
            Some(self.0)
        }
    }

    #[test]
    fn counts_kept_run_a_quarter_of_the_model_histories() {
        let asked = KeptCounts(Asking(100, MemoryFactory::default()));
        assert_eq!(asked.model_cases(), Some(25));
        assert_eq!(
            KeptCounts(Asking(2, MemoryFactory::default())).model_cases(),
            Some(1),
            "at least one"
        );
        let default = KeptCounts(MemoryFactory::default());
        assert_eq!(
            default.model_cases(),
            Some(crate::model::model_config().cases / 4)
        );
    }
}
