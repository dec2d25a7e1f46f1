//! One-command operations by the lease holder on servers with `SET ... IFEQ`
//! ([`crate::held`]): a commit, renewal or (with an injected clock) release is one plain
//! `SET` when the store remembers the value it wrote for the lease; `Ok(None)` hands the
//! operation to its script.

use std::time::Duration;

use dedup_core::{Error, Lease, Result, Timestamp, duration_millis};
use redis::{Cmd, Value};

use crate::decode::{self, Swap};
use crate::error::{backend, refused};
use crate::held::Held;
use crate::schema::{self, InFlight, Times};

use super::RedisStore;

/// One-command operations by the lease holder ([`crate::held`]): `Ok(None)` when the
/// script must run instead (the store does not remember the lease's value, the server has
/// no `IFEQ`, the key holds something else).
impl RedisStore {
    /// The value this store wrote for `lease`, with its Redis key, if it remembers it and
    /// it is not past its retention by the injected clock (`now`).
    fn held_value(&self, lease: &Lease, now: Option<i64>) -> Option<(&Held, String, InFlight)> {
        let held = self.held.as_deref()?;
        let key = self.redis_key(&lease.key);
        let record = held.get(lease.token, &key)?;
        if let (Some(now), Times::Absolute { retain_until, .. }) = (now, record.times)
            && retain_until <= now
        {
            // Absent by the store's clock: the script says so (LeaseLost).
            held.remove(lease.token);
            return None;
        }
        Some((held, key, record))
    }

    /// Send `SET ... IFEQ` (`cmds[0]`, alone or first of a transaction) and read what the
    /// key held; `Ok(None)` when the server refused the command (the script runs instead).
    async fn swap(&self, cmds: &[Cmd], expected: &[u8]) -> Result<Option<(Swap, Vec<Value>)>> {
        let replies = if let [cmd] = cmds {
            self.conn.query::<Value>(cmd).await.map(|v| vec![v])
        } else {
            let mut pipe = redis::pipe();
            pipe.atomic();
            for cmd in cmds {
                pipe.add_command(cmd.clone());
            }
            self.conn.query_pipeline(&pipe).await
        };
        match replies {
            Ok(replies) => match replies.first() {
                Some(Value::ServerError(_)) => Ok(None),
                Some(first) => Ok(Some((decode::swap(first, expected), replies))),
                None => Ok(None),
            },
            Err(e) if refused(&e) => Ok(None),
            Err(e) => Err(backend(e)),
        }
    }

    /// The one-command commit of `lease` at `now` (the injected clock's), if this store
    /// remembers its value.
    pub(super) fn commit_swap(
        &self,
        lease: &Lease,
        outcome: Option<&[u8]>,
        now: Option<i64>,
    ) -> Option<Swapping> {
        let (_, key, record) = self.held_value(lease, now)?;
        let retention_ms = self.retention_ms();
        let expected = record.value();
        let cmd = schema::set_ifeq(
            &key,
            &record.committed(now, retention_ms, outcome),
            expected.as_bytes(),
            retention_ms,
        );
        Some(Swapping { key, cmd, expected })
    }

    pub(super) async fn commit_by_swap(
        &self,
        lease: &Lease,
        outcome: Option<&[u8]>,
    ) -> Result<Option<Result<()>>> {
        let now = self.clock_now().map(Timestamp::as_millis);
        let (Some(held), Some(s)) = (self.held.as_deref(), self.commit_swap(lease, outcome, now))
        else {
            return Ok(None);
        };
        let answer = self.swap(&[s.cmd], s.expected.as_bytes()).await?;
        held.remove(lease.token);
        Ok(answer.and_then(|(swap, _)| committed_by_swap(lease, swap)))
    }

    pub(super) async fn renew_by_swap(
        &self,
        lease: &Lease,
        extend_by: Duration,
    ) -> Result<Option<Result<Lease>>> {
        let now = self.clock_now().map(Timestamp::as_millis);
        let Some((held, key, record)) = self.held_value(lease, now) else {
            return Ok(None);
        };
        let retention_ms = self.retention_ms();
        let extend_ms = duration_millis(extend_by);
        let renewed = InFlight {
            times: match now {
                // The server sets the key's expiry from its own "now"; PEXPIRETIME, in the
                // same transaction, gives the lease's expiry back exactly.
                None => Times::Relative {
                    lease_ms: extend_ms,
                    retention_ms,
                },
                Some(now) => {
                    let expires_at = now.saturating_add(extend_ms);
                    Times::Absolute {
                        expires_at,
                        retain_until: expires_at.saturating_add(retention_ms),
                    }
                }
            },
            ..record.clone()
        };
        let value = record.value();
        let mut cmds = vec![schema::set_ifeq(
            &key,
            renewed.value().as_bytes(),
            value.as_bytes(),
            renewed.ttl_ms(now),
        )];
        if now.is_none() {
            let mut expiry = redis::cmd("PEXPIRETIME");
            expiry.arg(&key);
            cmds.push(expiry);
        }
        let answer = self.swap(&cmds, value.as_bytes()).await?;
        let (swap, replies) = match answer {
            Some(answer) => answer,
            None => {
                held.remove(lease.token);
                return Ok(None);
            }
        };
        let expires_at = match (swap, renewed.times) {
            (Swap::Written, Times::Absolute { expires_at, .. }) => expires_at,
            (Swap::Written, Times::Relative { .. }) => {
                match decode::fresh::key_expiry(replies.get(1)) {
                    Some(at) => at.saturating_sub(retention_ms),
                    None => {
                        return Err(Error::corrupt(
                            &lease.key,
                            "a renewed lease without an expiry",
                        ));
                    }
                }
            }
            (Swap::Absent, _) => {
                held.remove(lease.token);
                return Ok(Some(Err(Error::LeaseLost {
                    key: lease.key.clone(),
                })));
            }
            (Swap::Other, _) => {
                held.remove(lease.token);
                return Ok(None);
            }
        };
        held.insert(&key, renewed.clone());
        Ok(Some(Ok(Lease {
            key: lease.key.clone(),
            token: lease.token,
            fence: renewed.fence,
            attempt: renewed.attempt,
            expires_at: Timestamp::from_millis(expires_at),
        })))
    }

    /// With an injected clock only: on the server's clock a release ends the lease at the
    /// earlier of its expiry and the server's "now", which takes the script.
    pub(super) async fn release_by_swap(&self, lease: &Lease) -> Result<Option<Result<()>>> {
        let Some(now) = self.clock_now().map(Timestamp::as_millis) else {
            return Ok(None);
        };
        let Some((held, key, record)) = self.held_value(lease, Some(now)) else {
            return Ok(None);
        };
        let Times::Absolute { expires_at, .. } = record.times else {
            return Ok(None);
        };
        let expires_at = expires_at.min(now);
        let released = InFlight {
            times: Times::Absolute {
                expires_at,
                retain_until: expires_at.saturating_add(self.retention_ms()),
            },
            ..record.clone()
        };
        let value = record.value();
        let cmd = schema::set_ifeq(
            &key,
            released.value().as_bytes(),
            value.as_bytes(),
            released.ttl_ms(Some(now)),
        );
        let answer = self.swap(&[cmd], value.as_bytes()).await?;
        Ok(match answer {
            Some((Swap::Written, _)) => {
                held.insert(&key, released);
                Some(Ok(()))
            }
            Some((Swap::Absent, _)) => {
                held.remove(lease.token);
                Some(Err(Error::LeaseLost {
                    key: lease.key.clone(),
                }))
            }
            Some((Swap::Other, _)) | None => {
                held.remove(lease.token);
                None
            }
        })
    }
}

/// A one-command commit: its key, the `SET ... IFEQ` and the value it expects.
pub(super) struct Swapping {
    pub(super) key: String,
    pub(super) cmd: Cmd,
    pub(super) expected: String,
}

/// A commit's answer from what its `SET ... IFEQ` found; `None`: the script decides.
pub(super) fn committed_by_swap(lease: &Lease, swap: Swap) -> Option<Result<()>> {
    match swap {
        Swap::Written => Some(Ok(())),
        Swap::Absent => Some(Err(Error::LeaseLost {
            key: lease.key.clone(),
        })),
        Swap::Other => None,
    }
}
