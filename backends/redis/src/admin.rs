//! The operator's reads ([`AdminStorage`], hence [`Admin`](dedup_core::Admin)) for
//! [`RedisStore`]: listing and counting by walking the key prefix with `SCAN`.
//!
//! Redis has no index to ask, so both read keys one by one:
//! - [`list`](dedup_core::Admin::list) runs `SCAN MATCH <prefix><consumer>:*` over the whole
//!   keyspace (every primary of a cluster), keeps the message ids after `after` in byte
//!   order, then reads their records with the store's `get` script, in pipelines of 200,
//!   until `limit` records pass the status filter. It holds the matching key names in
//!   memory.
//! - [`stats`](dedup_core::Admin::stats) and [`consumers`](dedup_core::Admin::consumers)
//!   run `SCAN MATCH <prefix>*` and read every record the same way (`consumers` holds one
//!   set of counts per consumer, at most `MAX_CONSUMERS`, the first in name order).
//!
//! `SCAN` steps ask for 100 keys each: every step walks part of the server's whole keyspace
//! (other applications' keys included) and blocks that server's one thread while it runs,
//! so small steps keep a shared server responsive, at the price of more round trips. Expect
//! about one round trip per 100 keys of the server's keyspace plus one per 200 records;
//! run them when an operator asks, not in a monitoring loop. The size of the key space is not
//! reported (`size_bytes` is `None`).
//!
//! Forgetting a record and revoking a lease are one script each (`lua/forget.lua`,
//! `lua/revoke.lua`), atomic on the server like every write.
//!
//! Keys under the prefix that do not have the record layout are skipped; a key with the
//! layout holding something that is not a record is an error naming it (as `get` reports).

use async_trait::async_trait;
use std::time::Duration;

use dedup_core::admin::{ConsumerCounts, ConsumerTally, Forgot, ListFilter, PurgeCount, Stats};
use dedup_core::backend::AdminStorage;
use dedup_core::{Key, LeaseToken, Record, Result, Timestamp, duration_millis};

use crate::RedisStore;
use crate::decode;
use crate::error::backend;
use crate::schema::{encode_into, key_of};
use crate::scripts::{Call, FORGET, GET, REVOKE};
use crate::token;

/// Keys asked of one `SCAN` step (a hint to the server).
const SCAN_COUNT: usize = 100;
/// Records read per pipeline.
const READ_CHUNK: usize = 200;

/// `text` with the glob characters of `SCAN MATCH` escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl RedisStore {
    /// Every key matching `pattern`, on every node, as dedup keys (others skipped), in key
    /// order, each once (`SCAN` may return a key twice).
    async fn scan_keys(&self, pattern: &str) -> Result<Vec<(Key, Vec<u8>)>> {
        let conn = self.conn();
        let prefix = &self.config().prefix;
        let mut keys = Vec::new();
        for node in conn.scan_nodes().await.map_err(backend)? {
            let mut cursor = 0;
            loop {
                let step = conn
                    .scan(&node, cursor, pattern, SCAN_COUNT)
                    .await
                    .map_err(backend)?;
                keys.extend(
                    step.keys
                        .into_iter()
                        .filter_map(|rk| key_of(prefix, &rk).map(|k| (k, rk))),
                );
                if step.next == 0 {
                    break;
                }
                cursor = step.next;
            }
        }
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        keys.dedup_by(|a, b| a.0 == b.0);
        Ok(keys)
    }

    /// Call `f` on every record under the prefix, in key order.
    async fn each_record(&self, mut f: impl FnMut(&Record) + Send) -> Result<()> {
        let pattern = format!("{}*", glob_escape(&self.config().prefix));
        let keys = self.scan_keys(&pattern).await?;
        for chunk in keys.chunks(READ_CHUNK) {
            for record in self.read_records(chunk).await? {
                f(&record);
            }
        }
        Ok(())
    }

    /// The records of `keys` (those still present), in order.
    async fn read_records(&self, keys: &[(Key, Vec<u8>)]) -> Result<Vec<Record>> {
        let now = self.now_arg();
        let calls: Vec<Call> = keys
            .iter()
            .map(|(_, rk)| Call::new(&GET, rk.clone()).arg(now.as_str()))
            .collect();
        let replies = self.conn().eval_many(&calls, None).await.map_err(backend)?;
        let mut out = Vec::with_capacity(keys.len());
        for ((key, _), value) in keys.iter().zip(replies.values) {
            out.extend(decode::get(key, value)?);
        }
        Ok(out)
    }
}

#[async_trait]
impl AdminStorage for RedisStore {
    async fn now(&self) -> Result<Timestamp> {
        if let Some(clock) = &self.config().clock {
            return Ok(clock.now());
        }
        let (secs, micros): (i64, i64) = self
            .conn()
            .query(&redis::cmd("TIME"))
            .await
            .map_err(backend)?;
        Ok(Timestamp::from_millis(secs * 1000 + micros / 1000))
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        let mut head = self.config().prefix.clone();
        encode_into(&mut head, &filter.consumer);
        head.push(':');
        let mut keys = self.scan_keys(&format!("{}*", glob_escape(&head))).await?;
        keys.retain(|(k, _)| {
            k.consumer() == filter.consumer
                && filter.after.as_deref().is_none_or(|a| k.message_id() > a)
        });
        let now = AdminStorage::now(self).await?;
        let mut out = Vec::new();
        for chunk in keys.chunks(READ_CHUNK) {
            let records = self.read_records(chunk).await?;
            out.extend(records.into_iter().filter(|r| filter.accepts(r, now)));
            if out.len() >= filter.limit {
                break;
            }
        }
        out.truncate(filter.limit);
        Ok(out)
    }

    async fn stats(&self, top: usize) -> Result<Stats> {
        let mut stats = Stats::at(AdminStorage::now(self).await?);
        self.each_record(|record| stats.add(record, top)).await?;
        Ok(stats)
    }

    async fn consumers(&self) -> Result<Vec<ConsumerCounts>> {
        let mut tally = ConsumerTally::at(AdminStorage::now(self).await?);
        self.each_record(|record| tally.add(record)).await?;
        Ok(tally.finish())
    }

    async fn count_purgeable(&self, retention: Duration) -> Result<PurgeCount> {
        let now = AdminStorage::now(self).await?;
        let mut count = PurgeCount::default();
        self.each_record(|record| count.add(record, now, retention))
            .await?;
        Ok(count)
    }

    async fn last_purge(&self) -> Result<Option<dedup_core::PurgeRun>> {
        self.last_purge_run().await
    }

    async fn forget(&self, key: &Key, force: bool) -> Result<Forgot> {
        let call = Call::new(&FORGET, self.redis_key(key))
            .arg(self.now_arg())
            .arg(if force { "1" } else { "0" });
        let value = self.conn().eval(&call).await.map_err(backend)?;
        decode::forget(key, value)
    }

    async fn revoke(
        &self,
        key: &Key,
        token: LeaseToken,
        force: bool,
        new_token: LeaseToken,
    ) -> Result<bool> {
        let call = Call::new(&REVOKE, self.redis_key(key))
            .arg(self.now_arg())
            .arg(token::text(token))
            .arg(if force { "1" } else { "0" })
            .arg(token::text(new_token))
            .arg(duration_millis(self.config().retention));
        let value = self.conn().eval(&call).await.map_err(backend)?;
        decode::revoke(key, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape("p:a*b?[c]\\"), "p:a\\*b\\?\\[c\\]\\\\");
    }
}
