//! Decoding the scripts' replies (see the `Reply:` line atop each `lua/*.lua`) into the
//! contract's values. Anything unexpected is [`Error::Corrupt`], never a panic.

use std::time::Duration;

use dedup_core::backend::{RawRecord, RawState, attempt_from, fence_from};
use dedup_core::{
    Claim, ClaimOptions, Error, Key, Lease, LeaseToken, Record, Result, Timestamp, transition,
};
use redis::{FromRedisValue, RedisError, RedisResult, Value};

use crate::error::backend;
use crate::record;

/// A script's reply array, with the key it was about (for errors).
struct Reply<'a> {
    key: &'a Key,
    items: Vec<Value>,
}

impl<'a> Reply<'a> {
    fn new(key: &'a Key, value: Value) -> Result<Self> {
        match value {
            Value::Array(items) if !items.is_empty() => Ok(Reply { key, items }),
            other => Err(Error::corrupt(
                key,
                format!("unexpected script reply {other:?}"),
            )),
        }
    }

    fn corrupt(&self, detail: impl Into<String>) -> Error {
        Error::corrupt(self.key, detail)
    }

    fn tag(&self) -> Result<&str> {
        self.text(0)?
            .ok_or_else(|| self.corrupt("script reply without a tag"))
    }

    /// Item `i` as text; `None` when nil.
    fn text(&self, i: usize) -> Result<Option<&str>> {
        match self.items.get(i) {
            Some(Value::BulkString(b)) => std::str::from_utf8(b)
                .map(Some)
                .map_err(|_| self.corrupt(format!("reply item {i} is not UTF-8"))),
            Some(Value::SimpleString(s)) => Ok(Some(s)),
            Some(Value::Nil | Value::Boolean(false)) => Ok(None),
            other => Err(self.corrupt(format!("reply item {i} is {other:?}, expected text"))),
        }
    }

    /// Item `i` as bytes; `None` when nil.
    fn bytes(&self, i: usize) -> Result<Option<Vec<u8>>> {
        match self.items.get(i) {
            Some(Value::BulkString(b)) => Ok(Some(b.clone())),
            Some(Value::SimpleString(s)) => Ok(Some(s.clone().into_bytes())),
            Some(Value::Nil | Value::Boolean(false)) => Ok(None),
            other => Err(self.corrupt(format!("reply item {i} is {other:?}, expected bytes"))),
        }
    }

    fn int(&self, i: usize) -> Result<i64> {
        match self.items.get(i) {
            Some(Value::Int(n)) => Ok(*n),
            Some(Value::BulkString(b)) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| self.corrupt(format!("reply item {i} is not an integer"))),
            other => Err(self.corrupt(format!("reply item {i} is {other:?}, expected an integer"))),
        }
    }

    fn fence(&self, i: usize) -> Result<u64> {
        fence_from(self.key, self.int(i)?)
    }

    fn attempt(&self, i: usize) -> Result<u32> {
        attempt_from(self.key, self.int(i)?)
    }

    fn timestamp(&self, i: usize) -> Result<Timestamp> {
        self.int(i).map(Timestamp::from_millis)
    }

    /// Item `i` as an integer; `None` when nil.
    fn optional_int(&self, i: usize) -> Result<Option<i64>> {
        match self.items.get(i) {
            Some(Value::Nil | Value::Boolean(false)) | None => Ok(None),
            Some(_) => self.int(i).map(Some),
        }
    }

    /// The shared endings: `{'L'}` lease lost, `{'X', detail}` not a dedup record.
    fn common(&self, tag: &str, lease: Option<&Lease>) -> Error {
        match (tag, lease) {
            ("L", Some(lease)) => Error::LeaseLost {
                key: lease.key.clone(),
            },
            ("X", _) => {
                let detail = self.text(1).ok().flatten().unwrap_or("unreadable record");
                self.corrupt(detail.to_owned())
            }
            _ => self.corrupt(format!("unexpected script reply tag {tag:?}")),
        }
    }
}

/// `claim.lua`'s reply; `token` is the token the call proposed for a new lease.
pub(crate) fn claim(key: &Key, token: LeaseToken, value: Value) -> Result<Claim> {
    let r = Reply::new(key, value)?;
    match r.tag()? {
        "A" => Ok(Claim::Acquired(Lease {
            key: key.clone(),
            token,
            fence: r.fence(1)?,
            attempt: r.attempt(2)?,
            expires_at: r.timestamp(3)?,
        })),
        "I" => Ok(Claim::InFlight {
            expires_at: r.timestamp(1)?,
            attempt: r.attempt(2)?,
        }),
        "C" => Ok(Claim::Completed {
            processed_at: r.timestamp(1)?,
            outcome: r.bytes(2)?,
        }),
        "F" => Err(Error::FingerprintMismatch { key: key.clone() }),
        tag => Err(r.common(tag, None)),
    }
}

/// What the reply to a fresh-key claim (`SET ... NX PX ... GET`, see [`record::fresh_claim`])
/// settles.
pub(crate) enum Fresh {
    /// The claim's result, from this one round trip.
    Answered(Result<Claim>),
    /// The key holds something the claim script must judge (an in-flight record, a layout-1
    /// hash, a record past its retention by an injected clock, a value of another kind).
    Script,
}

/// The reply to a fresh-key claim of `key` proposing `token` (`expires_at`: the lease's
/// expiry as [`record::fresh_claim`] computed it; `now`: the injected clock's time, if any;
/// `key_expiry`: the key's expiry from the `PEXPIRETIME` sent after the `SET`, if any).
/// `Err` when the command itself failed (the connection, a server error other than
/// `WRONGTYPE`).
pub(crate) fn fresh_claim(
    key: &Key,
    token: LeaseToken,
    options: &ClaimOptions,
    expires_at: Timestamp,
    now: Option<Timestamp>,
    key_expiry: Option<i64>,
    reply: RedisResult<Value>,
) -> Result<Fresh> {
    let value = match reply {
        // The key was absent: the SET wrote the in-flight record.
        Ok(Value::Nil) => {
            return Ok(Fresh::Answered(Ok(Claim::Acquired(Lease {
                key: key.clone(),
                token,
                fence: 1,
                attempt: 1,
                expires_at,
            }))));
        }
        Ok(Value::BulkString(value)) => value,
        // A hash (layout 1) or a key of another type: the script reads or reports it.
        Err(e) if e.code() == Some("WRONGTYPE") => return Ok(Fresh::Script),
        Err(e) => return Err(backend(e)),
        Ok(other) => {
            return Ok(Fresh::Answered(Err(Error::corrupt(
                key,
                format!("unexpected reply to SET ... GET: {other:?}"),
            ))));
        }
    };
    Ok(match record::completed(key, &value, now, key_expiry) {
        None => Fresh::Script,
        Some(Err(e)) => Fresh::Answered(Err(e)),
        // A completed record answers any claim the same way whatever the time: Completed,
        // or FingerprintMismatch (the contract's own transition decides).
        Some(Ok(rec)) => Fresh::Answered(
            transition::claim(Some(&rec), key, options, Timestamp::EPOCH, token)
                .map(|(claim, _)| claim),
        ),
    })
}

/// `commit.lua`'s reply.
pub(crate) fn commit(lease: &Lease, value: Value) -> Result<()> {
    // Committed now: the bare string `OK`, not a table (cheaper for the server per key).
    if matches!(&value, Value::BulkString(b) if b == b"OK")
        || matches!(&value, Value::SimpleString(s) if s == "OK")
    {
        return Ok(());
    }
    let r = Reply::new(&lease.key, value)?;
    match r.tag()? {
        "D" => Ok(()),
        tag => Err(r.common(tag, Some(lease))),
    }
}

/// `renew.lua`'s reply.
pub(crate) fn renew(lease: &Lease, value: Value) -> Result<Lease> {
    let r = Reply::new(&lease.key, value)?;
    match r.tag()? {
        "OK" => Ok(Lease {
            key: lease.key.clone(),
            token: lease.token,
            fence: r.fence(1)?,
            attempt: r.attempt(2)?,
            expires_at: r.timestamp(3)?,
        }),
        tag => Err(r.common(tag, Some(lease))),
    }
}

/// `release.lua`'s reply.
pub(crate) fn release(lease: &Lease, value: Value) -> Result<()> {
    let r = Reply::new(&lease.key, value)?;
    match r.tag()? {
        "OK" => Ok(()),
        tag => Err(r.common(tag, Some(lease))),
    }
}

/// `get.lua`'s reply.
pub(crate) fn get(key: &Key, value: Value) -> Result<Option<Record>> {
    let r = Reply::new(key, value)?;
    match r.tag()? {
        "N" => Ok(None),
        "R" => {
            let state = match r.text(1)? {
                Some("i") => RawState::InFlight,
                Some("c") => RawState::Completed,
                other => return Err(r.corrupt(format!("unknown state {other:?}"))),
            };
            RawRecord {
                state,
                token: r.text(2)?,
                fence: r.int(3)?,
                attempt: r.int(4)?,
                expires_at: r.optional_int(5)?,
                processed_at: r.optional_int(6)?,
                outcome: r.bytes(7)?,
                fingerprint: r.text(8)?,
            }
            .decode(key)
            .map(Some)
        }
        tag => Err(r.common(tag, None)),
    }
}

/// `purge_step.lua`'s reply: one purge step on one node.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PurgeStep {
    /// Where `SCAN` goes on from (0: the node's keyspace is walked), or `None` when the step
    /// did not scan (given no cursor, or out of room or time first): the walk stays where
    /// it was. Never the cursor given back, which at a walk's start is 0 too.
    pub(crate) cursor: Option<u64>,
    /// Completed records removed.
    pub(crate) completed: u64,
    /// Expired in-flight records removed.
    pub(crate) expired: u64,
    /// Keys not looked at (out of room or time), in the order found.
    pub(crate) left: Vec<Vec<u8>>,
    /// Keys the node no longer owns (their slot moved since `SCAN` found them).
    pub(crate) elsewhere: Vec<Vec<u8>>,
    /// How long the step held the server.
    pub(crate) server_time: Duration,
}

/// Decode `purge_step.lua`'s reply.
pub(crate) fn purge_step(value: Value) -> RedisResult<PurgeStep> {
    type Keys = Vec<Vec<u8>>;
    let (cursor, completed, expired, left, elsewhere, server_us): (
        String,
        u64,
        u64,
        Keys,
        Keys,
        u64,
    ) = FromRedisValue::from_redis_value(value)?;
    let cursor = match cursor.as_str() {
        "" => None,
        c => Some(c.parse().map_err(|_| {
            RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "purge step cursor",
                c.to_owned(),
            ))
        })?),
    };
    Ok(PurgeStep {
        cursor,
        completed,
        expired,
        left,
        elsewhere,
        server_time: Duration::from_micros(server_us),
    })
}

/// What `purge.lua` did to one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Purged {
    /// Removed a completed record.
    Completed,
    /// Removed an expired in-flight record.
    Expired,
    /// Nothing counted (kept, already gone, past the store's retention, or foreign).
    Nothing,
}

/// `purge.lua`'s reply (a bare status letter).
pub(crate) fn purged(value: &Value) -> Purged {
    let tag: &[u8] = match value {
        Value::BulkString(b) => b,
        Value::SimpleString(s) => s.as_bytes(),
        _ => b"",
    };
    match tag {
        b"c" => Purged::Completed,
        b"e" => Purged::Expired,
        _ => Purged::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::new("c", "m").unwrap()
    }

    fn lease() -> Lease {
        Lease {
            key: key(),
            token: LeaseToken::random(),
            fence: 1,
            attempt: 1,
            expires_at: Timestamp::EPOCH,
        }
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn garbage_replies_are_corrupt_not_panics() {
        let lease = lease();
        let garbage = [
            Value::Nil,
            Value::Int(3),
            Value::Array(vec![]),
            Value::Array(vec![bulk("A")]),
            Value::Array(vec![bulk("A"), bulk("x"), Value::Int(1), Value::Int(1)]),
            Value::Array(vec![
                bulk("A"),
                Value::Int(-1),
                Value::Int(1),
                Value::Int(1),
            ]),
            Value::Array(vec![bulk("?")]),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::BulkString(vec![0xff])]),
        ];
        for g in garbage {
            let e = claim(&key(), LeaseToken::random(), g.clone()).unwrap_err();
            assert!(matches!(e, Error::Corrupt { .. }), "claim {g:?}: {e:?}");
            let e = commit(&lease, g.clone()).unwrap_err();
            assert!(matches!(e, Error::Corrupt { .. }), "commit {g:?}: {e:?}");
            let e = renew(&lease, g.clone()).unwrap_err();
            assert!(matches!(e, Error::Corrupt { .. }), "renew {g:?}: {e:?}");
            let e = get(&key(), g.clone()).unwrap_err();
            assert!(matches!(e, Error::Corrupt { .. }), "get {g:?}: {e:?}");
        }
        let x = Value::Array(vec![bulk("X"), bulk("the key holds a string")]);
        match release(&lease, x).unwrap_err() {
            Error::Corrupt { detail, .. } => assert_eq!(detail, "the key holds a string"),
            other => panic!("{other:?}"),
        }
        let bad_token = Value::Array(vec![
            bulk("R"),
            bulk("i"),
            bulk("not-a-uuid"),
            Value::Int(1),
            Value::Int(1),
            Value::Int(5),
            Value::Nil,
            Value::Nil,
            Value::Nil,
        ]);
        assert!(matches!(
            get(&key(), bad_token).unwrap_err(),
            Error::Corrupt { .. }
        ));
    }

    #[test]
    fn a_commit_reply_is_a_bare_ok_or_a_tagged_table() {
        let lease = lease();
        commit(&lease, bulk("OK")).unwrap();
        commit(&lease, Value::SimpleString("OK".into())).unwrap();
        commit(&lease, Value::Array(vec![bulk("D")])).unwrap();
        assert!(
            commit(&lease, Value::Array(vec![bulk("L")]))
                .unwrap_err()
                .is_lease_lost()
        );
        // Only the exact bare string: anything else bare is corrupt.
        assert!(matches!(
            commit(&lease, bulk("D")).unwrap_err(),
            Error::Corrupt { .. }
        ));
    }

    #[test]
    fn outcome_none_and_empty_differ() {
        let none = Value::Array(vec![bulk("C"), Value::Int(7), Value::Nil]);
        let empty = Value::Array(vec![bulk("C"), Value::Int(7), bulk("")]);
        assert_eq!(
            claim(&key(), LeaseToken::random(), none).unwrap(),
            Claim::Completed {
                processed_at: Timestamp::from_millis(7),
                outcome: None
            }
        );
        assert_eq!(
            claim(&key(), LeaseToken::random(), empty).unwrap(),
            Claim::Completed {
                processed_at: Timestamp::from_millis(7),
                outcome: Some(vec![])
            }
        );
    }
}
