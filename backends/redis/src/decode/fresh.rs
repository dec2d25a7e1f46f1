//! Decoding the reply to a fresh-key claim (`SET key value NX PX ttl GET`, pipelined with
//! `PEXPIRETIME key` on the server's clock; the value and commands are
//! [`crate::schema::fresh_claim`]'s): the key was absent (the claim is acquired), or the
//! value it held, read here when it is a completed record the client fully understands
//! (layout 2, see [`crate::schema`] and `lua/record.lua`) and handed to the claim script
//! otherwise.

use dedup_core::backend::{RawRecord, RawState, transition};
use dedup_core::{Claim, ClaimOptions, Error, Key, Lease, LeaseToken, Record, Result, Timestamp};
use redis::{RedisResult, Value};

use crate::error::backend;
use crate::token;

/// What the reply to a fresh-key claim (`SET ... NX PX ... GET`, see
/// [`schema::fresh_claim`](crate::schema::fresh_claim)) settles.
pub(crate) enum Fresh {
    /// The claim's result, from this one round trip.
    Answered(Result<Claim>),
    /// The key holds something the claim script must judge (an in-flight record, a layout-1
    /// hash, a record past its retention by an injected clock, a value of another kind).
    Script,
}

/// The reply to a fresh-key claim of `key` proposing `token` (`expires_at`: the lease's
/// expiry as [`FreshClaim::expires_at`](crate::schema::FreshClaim::expires_at) computed it;
/// `now`: the injected clock's time, if any; `key_expiry`: the key's expiry from the
/// `PEXPIRETIME` sent after the `SET`, if any).
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
    Ok(match completed(key, &value, now, key_expiry) {
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

/// The key's expiry from a `PEXPIRETIME` reply (ms since the epoch), if the key exists and
/// has one.
pub(crate) fn key_expiry(reply: Option<&Value>) -> Option<i64> {
    match reply {
        Some(Value::Int(at)) if *at > 0 => Some(*at),
        _ => None,
    }
}

/// The completed record `value` holds, if it is one the client can answer a claim from:
/// `None` for anything else (in flight, past its retention by `now` when a clock is
/// injected, not layout 2), which the claim script then reads and judges.
/// `Some(Err(Corrupt))` when the value has the layout but not a valid record (a token
/// that is not a UUID, a fence of 0).
///
/// A `d` record (a single commit under the server's clock) keeps its instants in the key's
/// expiry: `key_expiry` is the `PEXPIRETIME` pipelined after the `SET` that read `value`
/// ([`key_expiry`]), and without one (the key went away in between) the script judges it.
pub(crate) fn completed(
    key: &Key,
    value: &[u8],
    now: Option<Timestamp>,
    key_expiry: Option<i64>,
) -> Option<Result<Record>> {
    let (mut rest, relative) = match value.strip_prefix(b"2,c,") {
        Some(rest) => (rest, false),
        None => (value.strip_prefix(b"2,d,")?, true),
    };
    let mut next = || {
        let end = rest.iter().position(|&b| b == b',')?;
        let field = std::str::from_utf8(&rest[..end]).ok()?;
        rest = &rest[end + 1..];
        Some(field)
    };
    let number = |s: &str| -> Option<i64> { s.parse().ok() };
    let fence = number(next()?)?;
    let attempt = number(next()?)?;
    let a = number(next()?)?;
    let b = number(next()?)?;
    // 'c': a = processed_at, b = retain_until; 'd': b = the retention, the key's expiry
    // = retain_until.
    let (processed_at, retain_until) = if relative {
        let at = key_expiry?;
        (at.checked_sub(b)?, at)
    } else {
        (a, b)
    };
    let token = token::as_uuid_text(next()?);
    let fp_len: usize = next()?.parse().ok()?;
    if now.is_some_and(|now| retain_until <= now.as_millis()) {
        return None;
    }
    let fingerprint = std::str::from_utf8(rest.get(..fp_len)?).ok()?;
    let outcome = match rest.get(fp_len..)? {
        [] => None,
        [b',', outcome @ ..] => Some(outcome.to_vec()),
        _ => return None,
    };
    Some(
        RawRecord {
            state: RawState::Completed,
            token: (!token.is_empty()).then_some(&*token),
            fence,
            attempt,
            expires_at: None,
            processed_at: Some(processed_at),
            outcome,
            fingerprint: (fp_len > 0).then_some(fingerprint),
            // Redis records do not keep the first claim time; a layout-2 record keeps no
            // failure's cause (one with a cause is layout 3, which the claim script reads).
            first_claimed_at: None,
            last_failure: None,
        }
        .decode(key),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::new("c", "m").unwrap()
    }

    /// A completed record's processed_at, outcome and committing token.
    fn completion(r: Record) -> (Timestamp, Option<Vec<u8>>, Option<LeaseToken>) {
        match r.state {
            dedup_core::RecordState::Completed {
                processed_at,
                outcome,
                token,
            } => (processed_at, outcome, token),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_completed_value_is_read_with_its_outcome_and_fingerprint() {
        let token = LeaseToken::random();
        let v = format!("2,c,3,2,1700,9999,{token},4,a,b|,out,come");
        let r = completed(&key(), v.as_bytes(), None, None)
            .unwrap()
            .unwrap();
        assert_eq!(r.fence, 3);
        assert_eq!(r.attempt, 2);
        assert_eq!(r.fingerprint.as_ref().unwrap().as_str(), "a,b|");
        assert_eq!(
            completion(r),
            (
                Timestamp::from_millis(1700),
                Some(b"out,come".to_vec()),
                Some(token)
            )
        );
        let none = format!("2,c,1,1,5,9999,{token},0,");
        let empty = format!("2,c,1,1,5,9999,{token},0,,");
        let outcome = |v: &str| {
            completion(
                completed(&key(), v.as_bytes(), None, None)
                    .unwrap()
                    .unwrap(),
            )
            .1
        };
        assert_eq!(outcome(&none), None);
        assert_eq!(outcome(&empty), Some(vec![]));
    }

    /// A `d` record (a single commit on the server's clock) takes its instants from the
    /// key's expiry: processed_at is the expiry less the retention it holds; without an
    /// expiry (the key went away after the `SET` read it) the script judges it. Its token
    /// is read in Z85, as written now, and as the UUID text earlier records hold.
    #[test]
    fn a_fast_path_commit_is_read_with_the_keys_expiry() {
        let token = LeaseToken::random();
        let z85 = crate::token::text(token);
        for held in [z85, token.to_string()] {
            let v = format!("2,d,3,2,0,600000,{held},2,fp,out");
            let r = completed(&key(), v.as_bytes(), None, Some(1_000_600_000))
                .unwrap()
                .unwrap();
            assert_eq!((r.fence, r.attempt), (3, 2));
            assert_eq!(r.fingerprint.as_ref().unwrap().as_str(), "fp");
            assert_eq!(
                completion(r),
                (
                    Timestamp::from_millis(1_000_000_000),
                    Some(b"out".to_vec()),
                    Some(token)
                ),
                "{v}"
            );
        }
        let v = format!("2,d,3,2,0,600000,{},2,fp,out", crate::token::text(token));
        assert!(completed(&key(), v.as_bytes(), None, None).is_none());
        // Past its retention by an injected clock: the key's expiry is retain_until.
        let at = Timestamp::from_millis(1_000_600_000);
        assert!(completed(&key(), v.as_bytes(), Some(at), Some(at.as_millis())).is_none());
    }

    #[test]
    fn anything_else_goes_to_the_script() {
        let token = LeaseToken::random();
        for v in [
            format!("2,i,1,1,5,9999,{token},0,"),
            format!("2,l,1,1,5,9999,{token},0,"),
            format!("1,c,1,1,5,9999,{token},0,"),
            format!("2,c,x,1,5,9999,{token},0,"),
            format!("2,c,1,1,5,9999,{token},9,ab"),
            format!("2,c,1,1,5,9999,{token},0,junk"),
            "not a record".to_owned(),
        ] {
            assert!(completed(&key(), v.as_bytes(), None, None).is_none(), "{v}");
        }
        // Past its retention by an injected clock.
        let v = format!("2,c,1,1,5,9999,{token},0,");
        assert!(
            completed(
                &key(),
                v.as_bytes(),
                Some(Timestamp::from_millis(9999)),
                None
            )
            .is_none()
        );
        assert!(
            completed(
                &key(),
                v.as_bytes(),
                Some(Timestamp::from_millis(9998)),
                None
            )
            .is_some()
        );
    }

    #[test]
    fn a_layout_value_with_an_invalid_record_is_corrupt() {
        for v in ["2,c,1,1,5,9999,not-a-uuid,0,", "2,c,0,1,5,9999,,0,"] {
            assert!(
                matches!(
                    completed(&key(), v.as_bytes(), None, None),
                    Some(Err(dedup_core::Error::Corrupt { .. }))
                ),
                "{v}"
            );
        }
    }

    #[test]
    fn a_pexpiretime_reply_is_the_keys_expiry_when_it_has_one() {
        assert_eq!(key_expiry(Some(&Value::Int(10_000))), Some(10_000));
        assert_eq!(key_expiry(Some(&Value::Int(-2))), None);
        assert_eq!(key_expiry(Some(&Value::Int(-1))), None);
        assert_eq!(key_expiry(None), None);
    }
}
