//! The operator's reads ([`AdminStorage`], hence [`Admin`](dedup_core::Admin)) for
//! [`NatsKvStore`]: walking the store's records in stream order, one read each.
//!
//! - [`list`](dedup_core::Admin::list) reads every record of the consumer (the subject
//!   filter `<prefix>.<consumer>.*`), holds them in memory, sorts them by message id and
//!   keeps those after `after`, up to `limit`.
//! - [`stats`](dedup_core::Admin::stats), [`consumers`](dedup_core::Admin::consumers) and
//!   [`count_purgeable`](dedup_core::Admin::count_purgeable) read every record of the
//!   store.
//!
//! Expect one round trip per record: run them when an operator asks, not in a monitoring
//! loop. Forgetting a record deletes the message read, by its sequence; revoking a lease
//! is a write conditional on the revision read. Both are atomic on the server.

use std::time::Duration;

use async_trait::async_trait;
use dedup_core::admin::{ConsumerCounts, ConsumerTally, Forgot, ListFilter, PurgeCount, Stats};
use dedup_core::backend::AdminStorage;
use dedup_core::backend::transition::{self, Write};
use dedup_core::{Key, LeaseToken, Record, Result, Timestamp};

use crate::NatsKvStore;
use crate::store::too_contended;

/// How many times `forget` reads again when the record changed before its delete.
const MAX_FORGET_RACES: usize = 64;

impl NatsKvStore {
    /// Call `f` on every record on subjects matching `filter`, in stream order.
    async fn each_record(&self, filter: &str, mut f: impl FnMut(Record) + Send) -> Result<()> {
        let mut from = 1;
        while let Some(stored) = self.messages().next(filter, from).await? {
            from = stored.revision + 1;
            let Some(key) = self.subjects().key_of(&stored.subject) else {
                continue;
            };
            if let Some(record) = self.record_of(&key, &stored)? {
                f(record);
            }
        }
        Ok(())
    }
}

#[async_trait]
impl AdminStorage for NatsKvStore {
    async fn now(&self) -> Result<Timestamp> {
        NatsKvStore::now(self).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        let now = NatsKvStore::now(self).await?;
        let mut records = Vec::new();
        let subjects = self.subjects().consumer_records(&filter.consumer);
        self.each_record(&subjects, |r| {
            let after = filter
                .after
                .as_deref()
                .is_none_or(|a| r.key.message_id() > a);
            if after && filter.accepts(&r, now) {
                records.push(r);
            }
        })
        .await?;
        records.sort_by(|a, b| a.key.cmp(&b.key));
        records.truncate(filter.limit);
        Ok(records)
    }

    async fn stats(&self, top: usize) -> Result<Stats> {
        let mut stats = Stats::at(NatsKvStore::now(self).await?);
        let all = self.subjects().all_records();
        self.each_record(&all, |r| stats.add(&r, top)).await?;
        Ok(stats)
    }

    async fn consumers(&self) -> Result<Vec<ConsumerCounts>> {
        let mut tally = ConsumerTally::at(NatsKvStore::now(self).await?);
        let all = self.subjects().all_records();
        self.each_record(&all, |r| tally.add(&r)).await?;
        Ok(tally.finish())
    }

    async fn count_purgeable(&self, retention: Duration) -> Result<PurgeCount> {
        let now = NatsKvStore::now(self).await?;
        let mut count = PurgeCount::default();
        let all = self.subjects().all_records();
        self.each_record(&all, |r| count.add(&r, now, retention))
            .await?;
        Ok(count)
    }

    async fn last_purge(&self) -> Result<Option<dedup_core::PurgeRun>> {
        self.last_purge_run().await
    }

    async fn forget(&self, key: &Key, force: bool) -> Result<Forgot> {
        for _ in 0..MAX_FORGET_RACES {
            let (revision, record) = self.read(key).await?;
            let now = NatsKvStore::now(self).await?;
            let answer = transition::forget(record.as_ref(), force, now);
            if !matches!(answer, Forgot::Forgot { .. }) || self.messages().remove(revision).await? {
                return Ok(answer);
            }
        }
        Err(too_contended(key))
    }

    async fn revoke(
        &self,
        key: &Key,
        token: LeaseToken,
        force: bool,
        new_token: LeaseToken,
    ) -> Result<bool> {
        self.apply(key, |record, now| {
            Ok(
                match transition::revoke(record, token, force, new_token, now) {
                    Some(revoked) => (true, Write::Put(revoked)),
                    None => (false, Write::Unchanged),
                },
            )
        })
        .await
    }
}
