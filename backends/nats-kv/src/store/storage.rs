//! [`NatsKvStore`]'s [`Storage`] implementation: every operation is
//! [`NatsKvStore::apply`] over its function of `transition`, except a claim, which first
//! tries to create the key (one round trip for a fresh key).
//!
//! Batches run their items at once, over the one connection (the writes are pipelined),
//! each key's items in order. JetStream's atomic batch publish is all or nothing, which
//! is not the meaning of a batch here (each item has its own answer), so it is not used.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::backend::Storage;
use dedup_core::backend::transition::{self, Write};
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, Failure, ItemResult, Key,
    Lease, LeaseToken, PurgeReport, Record, Result,
};
use futures::future::{BoxFuture, join_all};

use super::NatsKvStore;
use crate::messages::Written;

impl NatsKvStore {
    /// A claim that first tries to create the key: a fresh key is acquired in one write;
    /// an existing one goes through [`apply`](Self::apply).
    async fn claim_key(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        let token = LeaseToken::random();
        let now = self.now().await?;
        if let (claim, Write::Put(record)) = transition::claim(None, key, options, now, token)?
            && self.put(key, &record, 0, now).await? != Written::Conflict
        {
            return Ok(claim);
        }
        self.apply(key, |record, now| {
            transition::claim(record, key, options, now, token)
        })
        .await
    }

    async fn commit_lease(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        self.apply_held(&lease.key, lease.token, |record, now| {
            transition::commit(record, lease, outcome, now).map(|w| ((), w))
        })
        .await
    }
}

/// Run `each` over `items`, all keys at once and each key's items in order; the answers in
/// the order of `items`.
async fn batch<'a, I: Sync, T: Send>(
    items: &'a [I],
    key_of: impl Fn(&I) -> &Key,
    each: impl Fn(&'a I) -> BoxFuture<'a, T> + Sync,
) -> Vec<T> {
    let mut by_key: HashMap<&Key, Vec<usize>> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        by_key.entry(key_of(item)).or_default().push(i);
    }
    let each = &each;
    let runs = by_key.into_values().map(|indexes| async move {
        let mut answers = Vec::with_capacity(indexes.len());
        for i in indexes {
            answers.push((i, each(&items[i]).await));
        }
        answers
    });
    let mut answers: Vec<(usize, T)> = join_all(runs).await.into_iter().flatten().collect();
    answers.sort_by_key(|(i, _)| *i);
    answers.into_iter().map(|(_, t)| t).collect()
}

#[async_trait]
impl Storage for NatsKvStore {
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        self.claim_key(key, options).await
    }

    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        Ok(batch(
            requests,
            |r| &r.key,
            |r| Box::pin(self.claim_key(&r.key, &r.options)),
        )
        .await)
    }

    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        self.apply_held(&lease.key, lease.token, |record, now| {
            transition::renew(record, lease, extend_by, now)
        })
        .await
    }

    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        self.commit_lease(lease, outcome).await
    }

    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        Ok(batch(
            requests,
            |r| &r.lease.key,
            |r| Box::pin(self.commit_lease(&r.lease, r.outcome.as_deref())),
        )
        .await)
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.apply_held(&lease.key, lease.token, |record, now| {
            transition::release(record, lease, now).map(|w| ((), w))
        })
        .await
    }

    async fn release_failed(&self, lease: &Lease, failure: &Failure) -> Result<()> {
        self.apply_held(&lease.key, lease.token, |record, now| {
            transition::release_failed(record, lease, failure, now).map(|w| ((), w))
        })
        .await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        Ok(self.read(key).await?.1)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            persistent: true,
            multi_process: true,
            native_batch: false,
            native_ttl: true,
            transactional: false,
            server_clock: true,
            first_claim_time: true,
            failure_causes: true,
        }
    }

    async fn record_purge(&self, report: &PurgeReport) -> Result<()> {
        self.record_purge_run(report).await
    }
}
