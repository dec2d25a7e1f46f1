//! [`RedisStore`]'s [`Storage`] implementation: a fresh-key claim as `SET ... NX PX ... GET`
//! (settled here from its replies), the holder's operations in one command where the server
//! takes `SET ... IFEQ` ([`super::one_command`]), everything else one script call
//! ([`super::calls`]).

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use dedup_core::backend::Storage;
use dedup_core::{
    Capabilities, Claim, ClaimOptions, ClaimRequest, CommitRequest, Error, ItemResult, Key, Lease,
    LeaseToken, Record, Result, Timestamp, duration_millis,
};
use redis::{Cmd, RedisResult, Value};

use crate::decode::{self, fresh::Fresh};
use crate::error::{backend, refused};
use crate::schema::{self, FreshClaim};
use crate::scripts::{CLAIM_MANY, Call, GET, RELEASE, RENEW};

use super::one_command::{Swapping, committed_by_swap};
use super::{RedisStore, now_arg};

impl RedisStore {
    /// Settle a fresh-key claim of `key` (at `redis_key`) from its replies (see
    /// [`fresh_replies`]): answered (an acquired lease's record is then remembered for the
    /// one-command commit, renewal and release), or left for the claim script.
    fn settle_fresh(
        &self,
        key: &Key,
        redis_key: &str,
        options: &ClaimOptions,
        fresh: &FreshClaim,
        now: Option<Timestamp>,
        (set, expiry): (RedisResult<Value>, Option<Value>),
    ) -> Result<Fresh> {
        let key_expiry = decode::fresh::key_expiry(expiry.as_ref());
        let expires_at = fresh.expires_at(key_expiry);
        let token = fresh.record.token;
        let answer =
            decode::fresh::fresh_claim(key, token, options, expires_at, now, key_expiry, set)?;
        if let (Some(held), Fresh::Answered(Ok(Claim::Acquired(_)))) = (&self.held, &answer) {
            held.insert(redis_key, fresh.record.clone());
        }
        Ok(answer)
    }
}

/// The replies to one [`FreshClaim`]'s commands, taken in order from `replies`: the `SET`'s,
/// and the `PEXPIRETIME`'s when it was sent.
fn fresh_replies(
    key: &Key,
    fresh: &FreshClaim,
    replies: &mut impl Iterator<Item = RedisResult<Value>>,
) -> Result<(RedisResult<Value>, Option<Value>)> {
    let Some(set) = replies.next() else {
        return Err(Error::corrupt(key, "no reply to SET"));
    };
    let expiry = match fresh.expiry {
        Some(_) => replies.next().transpose().map_err(backend)?,
        None => None,
    };
    Ok((set, expiry))
}

#[async_trait]
impl Storage for RedisStore {
    /// A fresh key is claimed by `SET ... NX PX ... GET` alone (no script); a completed
    /// record it answers with settles the claim too. Anything else runs the claim script.
    ///
    /// [`claim_many`](Self::claim_many)'s steps for one item, without a batch's
    /// bookkeeping (request copies, per-item vectors, the slot plan): a single claim is the
    /// hot path, and its client-side work shows in the throughput at high concurrency.
    async fn claim(&self, key: &Key, options: &ClaimOptions) -> Result<Claim> {
        let now = self.clock_now();
        let redis_key = self.redis_key(key);
        let token = LeaseToken::random();
        let fresh = schema::fresh_claim(&redis_key, token, options, self.retention_ms(), now);
        let mut replies = self
            .conn
            .run_on_key(redis_key.as_bytes(), fresh.cmds())
            .await
            .map_err(backend)?
            .into_iter();
        let answer = fresh_replies(key, &fresh, &mut replies)?;
        match self.settle_fresh(key, &redis_key, options, &fresh, now, answer)? {
            Fresh::Answered(claim) => claim,
            Fresh::Script => {
                let call = self.claim_call(key, options, &now_arg(now), token);
                let batch = self
                    .conn
                    .eval_batch(&CLAIM_MANY, std::slice::from_ref(&call), None)
                    .await
                    .map_err(backend)?;
                match batch.values.into_iter().next() {
                    Some(v) => decode::claim(key, token, v),
                    None => Err(Error::corrupt(key, "no reply")),
                }
            }
        }
    }

    /// One pipeline of fresh-key claims (`SET ... NX PX ... GET`, and `PEXPIRETIME` with the
    /// server's clock; per primary in a cluster): a fresh key is claimed without a script,
    /// and a completed record it answers with settles the claim too. Then one claim script
    /// call (per slot) for the items it did not settle. Once an item of a key goes to the
    /// script, every later item of that key does too, so a repeated key sees its earlier
    /// items' writes in order.
    async fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<ItemResult<Claim>>> {
        let now = self.clock_now();
        let retention_ms = self.retention_ms();
        let keys: Vec<String> = requests.iter().map(|r| self.redis_key(&r.key)).collect();
        let tokens: Vec<LeaseToken> = requests.iter().map(|_| LeaseToken::random()).collect();
        let fresh: Vec<FreshClaim> = requests
            .iter()
            .zip(&keys)
            .zip(&tokens)
            .map(|((r, k), &t)| schema::fresh_claim(k, t, &r.options, retention_ms, now))
            .collect();
        let cmds: Vec<(&[u8], Cmd)> = keys
            .iter()
            .zip(&fresh)
            .flat_map(|(k, f)| f.cmds().map(move |c| (k.as_bytes(), c.clone())))
            .collect();
        let mut replies = self
            .conn
            .run_keyed(&cmds)
            .await
            .map_err(backend)?
            .into_iter();
        let mut results: Vec<Option<ItemResult<Claim>>> = Vec::with_capacity(requests.len());
        let mut scripted: HashSet<&str> = HashSet::new();
        let mut to_script = Vec::new();
        for (i, f) in fresh.iter().enumerate() {
            let r = &requests[i];
            let answer = fresh_replies(&r.key, f, &mut replies)?;
            let answer = if scripted.contains(keys[i].as_str()) {
                Fresh::Script
            } else {
                self.settle_fresh(&r.key, &keys[i], &r.options, f, now, answer)?
            };
            results.push(match answer {
                Fresh::Answered(claim) => Some(claim),
                Fresh::Script => {
                    scripted.insert(&keys[i]);
                    to_script.push(i);
                    None
                }
            });
        }
        if !to_script.is_empty() {
            let now = now_arg(now);
            let calls: Vec<Call> = to_script
                .iter()
                .map(|&i| self.claim_call(&requests[i].key, &requests[i].options, &now, tokens[i]))
                .collect();
            let batch = self
                .conn
                .eval_batch(&CLAIM_MANY, &calls, None)
                .await
                .map_err(backend)?;
            for (&i, v) in to_script.iter().zip(batch.values) {
                results[i] = Some(decode::claim(&requests[i].key, tokens[i], v));
            }
        }
        Ok(results
            .into_iter()
            .zip(requests)
            .map(|(r, req)| {
                r.unwrap_or_else(|| Err(Error::corrupt(&req.key, "no reply for this item")))
            })
            .collect())
    }

    async fn renew(&self, lease: &Lease, extend_by: Duration) -> Result<Lease> {
        if let Some(answer) = self.renew_by_swap(lease, extend_by).await? {
            return answer;
        }
        let call = self
            .lease_call(&RENEW, lease)
            .arg(duration_millis(extend_by))
            .arg(self.retention_ms());
        let value = self.conn.eval(&call).await.map_err(backend)?;
        decode::renew(lease, value)
    }

    async fn commit(&self, lease: &Lease, outcome: Option<&[u8]>) -> Result<()> {
        if self.config.wait_for_replicas.is_none()
            && let Some(answer) = self.commit_by_swap(lease, outcome).await?
        {
            return answer;
        }
        let call = self.commit_call(lease, outcome, &self.now_arg());
        if self.config.wait_for_replicas.is_none() {
            let value = self.conn.eval(&call).await.map_err(backend)?;
            return decode::commit(lease, value);
        }
        let mut results = self.run_commits(&[call], &[lease]).await?;
        results.pop().unwrap_or(Ok(()))
    }

    /// The leases this store remembers the values of commit by one `SET ... IFEQ` each, all
    /// in one pipeline (per primary); the rest, and those whose key held something else,
    /// then run as one script call (per slot). A commit's answer does not depend on the
    /// order of the batch's items (only the holder's token commits; the same lease twice is
    /// `Ok` twice), so the pipeline running first changes no item's result.
    async fn commit_many(&self, requests: &[CommitRequest]) -> Result<Vec<ItemResult<()>>> {
        let mut results: Vec<Option<ItemResult<()>>> = requests.iter().map(|_| None).collect();
        if self.config.wait_for_replicas.is_none()
            && let Some(held) = self.held.as_deref()
        {
            let now = self.clock_now().map(Timestamp::as_millis);
            let swaps: Vec<(usize, Swapping)> = requests
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    Some((i, self.commit_swap(&r.lease, r.outcome.as_deref(), now)?))
                })
                .collect();
            if !swaps.is_empty() {
                let cmds: Vec<(&[u8], Cmd)> = swaps
                    .iter()
                    .map(|(_, s)| (s.key.as_bytes(), s.cmd.clone()))
                    .collect();
                let replies = self.conn.run_keyed(&cmds).await.map_err(backend)?;
                for ((i, s), reply) in swaps.iter().zip(replies) {
                    let lease = &requests[*i].lease;
                    held.remove(lease.token);
                    results[*i] = match reply {
                        Ok(v) => committed_by_swap(lease, decode::swap(&v, s.expected.as_bytes())),
                        Err(e) if refused(&e) => None,
                        Err(e) => return Err(backend(e)),
                    };
                }
            }
        }
        let rest: Vec<usize> = (0..requests.len())
            .filter(|&i| results[i].is_none())
            .collect();
        if !rest.is_empty() {
            let now = self.now_arg();
            let calls: Vec<Call> = rest
                .iter()
                .map(|&i| {
                    self.commit_call(&requests[i].lease, requests[i].outcome.as_deref(), &now)
                })
                .collect();
            let leases: Vec<&Lease> = rest.iter().map(|&i| &requests[i].lease).collect();
            for (&i, result) in rest.iter().zip(self.run_commits(&calls, &leases).await?) {
                results[i] = Some(result);
            }
        }
        Ok(results
            .into_iter()
            .zip(requests)
            .map(|(r, req)| {
                r.unwrap_or_else(|| Err(Error::corrupt(&req.lease.key, "no reply for this item")))
            })
            .collect())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        if let Some(answer) = self.release_by_swap(lease).await? {
            return answer;
        }
        let call = self.lease_call(&RELEASE, lease).arg(self.retention_ms());
        let value = self.conn.eval(&call).await.map_err(backend)?;
        decode::release(lease, value)
    }

    /// Always the release script, given the encoded failure: it writes the record as layout
    /// 3 (see the crate's README), which the one-command paths never compare equal, so the
    /// value remembered for this lease is forgotten first.
    async fn release_failed(&self, lease: &Lease, failure: &dedup_core::Failure) -> Result<()> {
        if let Some(held) = self.held.as_deref() {
            held.remove(lease.token);
        }
        let call = self
            .lease_call(&RELEASE, lease)
            .arg(self.retention_ms())
            .arg(failure.encode());
        let value = self.conn.eval(&call).await.map_err(backend)?;
        decode::release(lease, value)
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        let call = Call::new(&GET, self.redis_key(key)).arg(self.now_arg());
        let value = self.conn.eval(&call).await.map_err(backend)?;
        decode::get(key, value)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            persistent: true,
            multi_process: true,
            native_batch: true,
            native_ttl: true,
            server_clock: self.config.clock.is_none(),
            failure_causes: true,
            ..Capabilities::default()
        }
    }

    async fn record_purge(&self, report: &dedup_core::PurgeReport) -> Result<()> {
        self.record_purge_run(report).await
    }
}
