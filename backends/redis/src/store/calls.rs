//! The script calls the store builds (claim, commit, the holder's lease operations) and the
//! batch commit through `lua/many.lua` with the configured replica wait.

use dedup_core::{ClaimOptions, Key, Lease, LeaseToken, Result, duration_millis};

use crate::decode;
use crate::error::{ReplicationShortfall, backend};
use crate::pipeline::BatchReply;
use crate::scripts::{CLAIM, COMMIT, COMMIT_MANY, Call, Lua};
use crate::token;

use super::RedisStore;

impl RedisStore {
    pub(super) fn claim_call(
        &self,
        key: &Key,
        options: &ClaimOptions,
        now: &str,
        token: LeaseToken,
    ) -> Call {
        let fingerprint = options.fingerprint.as_ref().map_or("", |f| f.as_str());
        // lua/one.lua: the batch's shared arguments (scripts::SHARED_ARGS) first.
        Call::new(&CLAIM, self.redis_key(key))
            .arg(now)
            .arg(self.retention_ms())
            .arg(token::text(token))
            .arg(duration_millis(options.lease))
            .arg(fingerprint)
    }

    pub(super) fn commit_call(&self, lease: &Lease, outcome: Option<&[u8]>, now: &str) -> Call {
        // lua/one.lua: the batch's shared arguments (scripts::SHARED_ARGS) first.
        Call::new(&COMMIT, self.redis_key(&lease.key))
            .arg(now)
            .arg(self.retention_ms())
            .arg(token::text(lease.token))
            .arg(if outcome.is_some() { "1" } else { "0" })
            .arg(outcome.unwrap_or_default())
    }

    pub(super) fn lease_call(&self, lua: &'static Lua, lease: &Lease) -> Call {
        Call::new(lua, self.redis_key(&lease.key))
            .arg(self.now_arg())
            .arg(token::text(lease.token))
    }

    /// Run commits (one script call per batch; in a cluster one per slot, one pipeline per
    /// primary) with the configured replica wait; the shortfall check applies when at least
    /// one commit succeeded (a lost lease wrote nothing to wait for).
    pub(super) async fn run_commits(
        &self,
        calls: &[Call],
        leases: &[&Lease],
    ) -> Result<Vec<Result<()>>> {
        let BatchReply {
            values,
            acknowledged,
        } = self
            .conn
            .eval_batch(&COMMIT_MANY, calls, self.config.wait_for_replicas)
            .await
            .map_err(backend)?;
        let results: Vec<Result<()>> = leases
            .iter()
            .zip(values)
            .map(|(lease, v)| decode::commit(lease, v))
            .collect();
        if let (Some((wanted, _)), Some(acked)) = (self.config.wait_for_replicas, acknowledged)
            && acked < i64::from(wanted)
            && results.iter().any(Result::is_ok)
        {
            return Err(ReplicationShortfall {
                wanted,
                acknowledged: u32::try_from(acked.max(0)).unwrap_or(0),
            }
            .into_error());
        }
        Ok(results)
    }
}
