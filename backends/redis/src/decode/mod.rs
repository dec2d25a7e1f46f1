//! Decoding what the server returns into the contract's values: the replies of the
//! operations' scripts (see the `Reply:` line atop each `lua/*.lua`) here, the reply to a
//! fresh-key claim (the record value a `SET ... GET` returns) in [`fresh`], the purge
//! scripts' replies in [`purge`]. Anything unexpected is [`Error::Corrupt`], never a panic.

pub(crate) mod fresh;
pub(crate) mod purge;

use dedup_core::backend::{RawRecord, RawState, attempt_from, fence_from};
use dedup_core::{Claim, Error, Forgot, Key, Lease, LeaseToken, Record, Result, Status, Timestamp};
use redis::Value;

use crate::token;

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

/// What a `SET ... IFEQ expected ... GET` ([`crate::held`]) found at its key.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Swap {
    /// The key held `expected`: the new value is written.
    Written,
    /// The key was absent: nothing written; every script answers this `LeaseLost`.
    Absent,
    /// Something else: nothing written; the script judges it.
    Other,
}

/// The reply to `SET ... IFEQ expected ... GET`: the value the key held.
pub(crate) fn swap(reply: &Value, expected: &[u8]) -> Swap {
    match reply {
        Value::Nil => Swap::Absent,
        Value::BulkString(held) if held.as_slice() == expected => Swap::Written,
        _ => Swap::Other,
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

/// `forget.lua`'s reply.
pub(crate) fn forget(key: &Key, value: Value) -> Result<Forgot> {
    let r = Reply::new(key, value)?;
    match r.tag()? {
        "F" => Ok(Forgot::Forgot {
            status: match r.text(1)? {
                Some("i") => Status::InFlight,
                Some("e") => Status::Expired,
                Some("c") => Status::of_outcome(r.bytes(4)?.as_deref()),
                other => return Err(r.corrupt(format!("unknown status {other:?}"))),
            },
            fence: r.fence(2)?,
            attempt: r.attempt(3)?,
        }),
        "H" => Ok(Forgot::LiveLease {
            expires_at: r.timestamp(1)?,
            attempt: r.attempt(2)?,
        }),
        "N" => Ok(Forgot::NotFound),
        tag => Err(r.common(tag, None)),
    }
}

/// `revoke.lua`'s reply: whether the lease was revoked.
pub(crate) fn revoke(key: &Key, value: Value) -> Result<bool> {
    let r = Reply::new(key, value)?;
    match r.tag()? {
        "OK" => Ok(true),
        "L" => Ok(false),
        tag => Err(r.common(tag, None)),
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
            let failure = r.bytes(9)?;
            let token = r.text(2)?.map(token::as_uuid_text);
            RawRecord {
                state,
                token: token.as_deref(),
                fence: r.int(3)?,
                attempt: r.int(4)?,
                expires_at: r.optional_int(5)?,
                processed_at: r.optional_int(6)?,
                outcome: r.bytes(7)?,
                fingerprint: r.text(8)?,
                // Redis records do not keep the first claim time.
                first_claimed_at: None,
                last_failure: failure.as_deref(),
            }
            .decode(key)
            .map(Some)
        }
        tag => Err(r.common(tag, None)),
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
